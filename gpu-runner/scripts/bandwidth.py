#!/usr/bin/env python3
"""GPU memory (HBM) read bandwidth, and the summary of gpu-check.sh's benchmarks.

    python3 gpu-runner/scripts/bandwidth.py [--gib 4] [--iters 10]
        Times torch.sum over a GiB-sized float32 tensor (reads it once) with CUDA events:
        the median of --iters runs after 3 warm-ups. Prints human text, then one line
        `bandwidth_gbs=<float>` (bytes read / time, 1 GB = 1e9 bytes). A device-to-device
        copy's (read + write) rate is printed for comparison.

    python3 gpu-runner/scripts/bandwidth.py summary --fallow-log F --hf-log H \\
            --bytes-per-step FILE [--bandwidth-gbs X] [--steps TSV] [--out FILE]
        Reads `fallow bench engine`'s table (F) and hf_bench.py's lines (H) and prints per
        batch size Fallow's and transformers' tokens/s and their ratios, then the batch-1
        roofline: bandwidth / bytes of weights read per decode step (FILE, written by
        make_random_llama.py), and Fallow's batch-1 decode as a share of it. Anything missing
        shows as "n/a"; the summary is written even when a step failed.
"""

import argparse
import math
import re
import statistics
import sys


def measure(gib, iters):
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("CUDA is not available to torch")
    dev = torch.cuda.get_device_properties(0)
    print(f"torch {torch.__version__}, {dev.name}, {dev.total_memory / 2**30:.0f} GiB")
    n = (gib << 30) // 4
    x = torch.ones(n, dtype=torch.float32, device="cuda")

    def timed(fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)

    nbytes = n * 4
    read_s = timed(lambda: x.sum())
    read_gbs = nbytes / read_s / 1e9
    y = torch.empty_like(x)
    copy_s = timed(lambda: y.copy_(x))
    copy_gbs = 2 * nbytes / copy_s / 1e9
    print(f"sum over {gib} GiB (read):        {read_gbs:8.1f} GB/s  ({read_s * 1e3:.2f} ms)")
    print(f"copy of {gib} GiB (read + write): {copy_gbs:8.1f} GB/s  ({copy_s * 1e3:.2f} ms)")
    print(f"bandwidth_gbs={read_gbs:.1f}")


def read_text(path):
    if not path:
        return ""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def parse_fallow(text):
    """{concurrency: (prefill, decode, aggregate, ttft_ms)} from `fallow bench engine`'s table:
    rows `concurrency constraint prefill decode aggregate TTFT generated CPU-ms` (only the
    unconstrained ones, constraint `none`), or the older 5-column rows without a constraint."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields or not fields[0].isdigit():
            continue
        if len(fields) >= 6 and fields[1] == "none":
            numbers = fields[2:6]
        elif len(fields) == 5:
            numbers = fields[1:5]
        else:
            continue
        try:
            vals = [float(v) for v in numbers]
        except ValueError:
            continue
        rows[int(fields[0])] = tuple(vals)
    return rows


def load_seconds(text):
    """The seconds `fallow bench engine` took to load its model (`loaded in X s`)."""
    found = re.findall(r"^loaded in ([0-9.]+) s$", text, re.MULTILINE)
    return float(found[0]) if found else None


def step_clock(text):
    """The rows of the backend's step clock (FALLOW_CUDA_DEBUG=step-clock: "CUDA step clock ..."
    then `step steps GPU in-backend between busy%` per step shape), the last table's."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("CUDA step clock"):
            rows, inside = [], True
        elif inside and re.match(r"^(decode|prompt|prompt\+decode) n=\d+\s", line):
            rows.append(line.rstrip())
        elif inside and not line.startswith("step "):
            inside = False
    return rows


def gemv_choices(text):
    """The GEMV tuning's choices from the backend's log line ("bf16 GEMV variants timed ...
    choices=["qkv 6144x4096 n=1: w8u4 12.0 µs (...)", ...]"), the last such line's."""
    found = []
    for line in text.splitlines():
        if "GEMV variants timed" in line and "choices=" in line:
            found = re.findall(r'"([^"]*)"', line.split("choices=", 1)[1])
    return found


def mmq_choices(text):
    """The int8 tensor-core products' timing against the expansion for cuBLAS, from the
    backend's log line ("int8 tensor-core products timed ... choices=["down 4096x14336 Q4K
    n=64: tensor cores (int8 tensor cores 50.1 µs, expanded for cuBLAS 120.4 µs)", ...]"),
    the last such line's."""
    found = []
    for line in text.splitlines():
        if "int8 tensor-core products timed" in line and "choices=" in line:
            found = re.findall(r'"([^"]*)"', line.split("choices=", 1)[1])
    return found


def cublas_products(text):
    """The decode-sized products the GEMV tuning gave to cuBLAS ("... products=[(4096, 4096,
    8), ...] decode-sized bf16 products ... cuBLAS multiplies faster ..."), the last line's."""
    found = None
    for line in text.splitlines():
        if "cuBLAS multiplies faster" in line and "products=" in line:
            found = line.split("products=", 1)[1].split("]", 1)[0] + "]"
    return found


HF_LINE = re.compile(r"^hf batch=(\d+) (.*)$")


def parse_hf(text):
    """{batch: {key: float}} from hf_bench.py's `hf batch=B key=value ...` lines."""
    rows = {}
    for line in text.splitlines():
        m = HF_LINE.match(line.strip())
        if not m:
            continue
        kv = {}
        for item in m.group(2).split():
            k, _, v = item.partition("=")
            try:
                kv[k] = float(v)
            except ValueError:
                pass
        if "decode_tok_s" in kv:
            rows[int(m.group(1))] = kv
    return rows


def fmt(v, spec=".1f"):
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def ratio(a, b):
    return a / b if a is not None and b else None


def summary(args):
    out = []
    say = out.append
    steps = read_text(args.steps).strip()
    if steps:
        say("step statuses:")
        for line in steps.splitlines():
            name, _, rest = line.partition("\t")
            say(f"  {name:<40} {rest}")
        say("")

    fallow = parse_fallow(read_text(args.fallow_log))
    hf = parse_hf(read_text(args.hf_log))
    say("Llama-3.1-8B shaped random bf16 model, tokens/s")
    say("  fallow decode    = tokens after each first one / time after all first tokens")
    say("  fallow aggregate = all generated tokens / total time (with prefill)")
    say("  HF decode-only   = B*(gen-1) / (generate time - 1-token generate time)")
    say("  HF with prefill  = B*gen / generate time")
    head = (
        f"{'batch':>5} {'fallow decode':>14} {'HF decode-only':>15} {'ratio':>6}"
        f" {'fallow aggr':>12} {'HF w/ prefill':>14} {'ratio':>6} {'fallow TTFT ms':>15}"
    )
    say(head)
    for b in sorted(set(fallow) | set(hf)):
        f = fallow.get(b)
        h = hf.get(b, {})
        f_dec, f_agg, f_ttft = (f[1], f[2], f[3]) if f else (None, None, None)
        h_dec, h_all = h.get("decode_only_tok_s"), h.get("decode_tok_s")
        say(
            f"{b:>5} {fmt(f_dec):>14} {fmt(h_dec):>15} {fmt(ratio(f_dec, h_dec), '.2f'):>6}"
            f" {fmt(f_agg):>12} {fmt(h_all):>14} {fmt(ratio(f_agg, h_all), '.2f'):>6} {fmt(f_ttft):>15}"
        )
    if not fallow:
        say("  (no fallow bench rows parsed)")
    if not hf:
        say("  (no HF rows parsed)")
    say("")

    per_step = None
    try:
        per_step = int(read_text(args.bytes_per_step).split()[0])
    except (IndexError, ValueError):
        pass
    bw = args.bandwidth_gbs
    roof = bw * 1e9 / per_step if bw and per_step else None
    say("batch-1 roofline (weights read once per decode step at the measured bandwidth):")
    say(f"  bandwidth        {fmt(bw)} GB/s")
    say(f"  bytes per step   {fmt(per_step / 1e9 if per_step else None, '.3f')} GB (bf16 weights, no embedding table)")
    say(f"  roofline         {fmt(roof)} tok/s")
    f1 = fallow.get(1)
    f1_dec = f1[1] if f1 else None
    h1_dec = hf.get(1, {}).get("decode_only_tok_s")
    pct = lambda v: fmt(100 * v / roof if v is not None and roof else None)  # noqa: E731
    say(f"  fallow batch 1   {fmt(f1_dec)} tok/s = {pct(f1_dec)} % of roofline")
    say(f"  HF batch 1       {fmt(h1_dec)} tok/s = {pct(h1_dec)} % of roofline")
    load_s = load_seconds(read_text(args.fallow_log))
    say(f"  fallow load      {fmt(load_s, '.2f')} s (model onto the GPU, with the GEMV timing)")

    clock = step_clock(read_text(args.fallow_log))
    if clock:
        say("")
        say("Step clock (f.): mean ms per step on the GPU, in the backend, between steps")
        say("(the engine's own work), and the share of the wall time the GPU is busy:")
        for row in clock:
            say(f"  {row}")

    gemv = gemv_choices(read_text(args.fallow_log))
    if gemv:
        say("")
        say("bf16 GEMV variants timed at load (fastest per shape; f.):")
        for choice in gemv:
            say(f"  {choice}")
    cublas = cublas_products(read_text(args.fallow_log))
    if gemv or cublas:
        say("decode-sized products through cuBLAS instead ([rows, cols, tuned rows]): "
            f"{cublas or 'none'}")

    # Other storages of the same models, and the 8B shape launched without early starts.
    for title, base_log, other_log, base_name, other in [
        ("8B shape: bf16 vs Q8_0 at load (f. vs f4.)", args.fallow_log, args.q8_log, "bf16",
         "q8_0"),
        ("8B shape: bf16 vs Q4_K at load (f. vs f13.)", args.fallow_log, args.q4k_log, "bf16",
         "q4_k"),
        ("8B shape, Q4_K at load: x read as bf16 vs rounded to int8 (f13. vs f14.; at 64 the "
         "blocks expanded for cuBLAS vs the int8 tensor-core products)",
         args.q4k_log, args.q4k_int8_log, "bf16 x", "q4_k int8 x"),
        ("8B shape, Q8_0 at load: x read as bf16 vs rounded to int8 (f4. vs f14.)",
         args.q8_log, args.q8_int8_log, "bf16 x", "q8_0 int8 x"),
        ("SmolLM2 Q4_1: bf16 vs its own blocks (c2.)", args.smol_bf16_log, args.smol_quant_log,
         "bf16", "quantized"),
        ("SmolLM2 Q4_1, its own blocks: x read as bf16 vs rounded to int8 (c2.)",
         args.smol_quant_log, args.smol_int8_log, "bf16 x", "int8 x"),
        ("SmolLM2 bf16: greedy vs sampled, temperature 0.8, top-p 0.9 (c2. vs c4.)",
         args.smol_bf16_log, args.smol_sampled_log, "greedy", "top-p"),
        ("8B shape: sub-block ends whole vs split with the next product (f. vs f15.)",
         args.fallow_log, args.split_norm_log, "whole", "split"),
        ("8B shape: early-start vs plain launches (f. vs f5.)", args.fallow_log, args.plain_log,
         "early", "plain"),
        ("8B shape: fused norms and RoPE vs add_rms_norm and qkv_prepare launches (f. vs f7.)",
         args.fallow_log, args.separate_norm_log, "fused", "separate"),
        ("8B shape: L2 prefetches before the waits vs none (f. vs f8.)", args.fallow_log,
         args.no_prefetch_log, "prefetch", "none"),
        ("8B shape: activation written by the gate/up GEMV vs staged by the down GEMV (f. vs f9.)",
         args.fallow_log, args.gated_down_log, "gate/up", "down"),
        ("8B shape: decode attention split from 64 keys vs from 256 (f. vs f10.)",
         args.fallow_log, args.split256_log, "64 keys", "256 keys"),
        ("8B shape: GEMVs timed with the tensor-core variants vs CUDA cores only (f. vs f11.)",
         args.fallow_log, args.cuda_cores_log, "with mma", "cores only"),
        ("8B shape: decode products timed against cuBLAS vs GEMVs only (f. vs f12.)",
         args.fallow_log, args.gemv_only_log, "w/ cuBLAS", "GEMV only"),
    ]:
        base, alt = parse_fallow(read_text(base_log)), parse_fallow(read_text(other_log))
        if not base and not alt:
            continue
        say("")
        say(title)
        say(f"{'batch':>5} {base_name + ' decode':>12} {other + ' decode':>16} {'ratio':>6}")
        for b in sorted(set(base) | set(alt)):
            d0 = base[b][1] if b in base else None
            d1 = alt[b][1] if b in alt else None
            say(f"{b:>5} {fmt(d0):>12} {fmt(d1):>16} {fmt(ratio(d1, d0), '.2f'):>6}")
        # Bytes per weight against bf16's 2: Q8_0 keeps 34 per 32 weights, Q4_K 144 per 256.
        share = {"q8_0": 34 / 64, "q4_k": 144 / 512, "q4_k int8 x": 144 / 512,
                 "q8_0 int8 x": 34 / 64}.get(other)
        if share and roof and 1 in alt:
            say(f"  {other} batch 1 = {pct(alt[1][1] * share)} % of its own roofline")

    # Batches of 9-64 with x as int8: the tensor cores or the expansion, per shape.
    for name, log in (("Q4_K", args.q4k_int8_log), ("Q8_0", args.q8_int8_log)):
        mmq = mmq_choices(read_text(log))
        if mmq:
            say("")
            say(f"8B shape, {name} at load, x as int8: int8 tensor-core products timed against "
                "the blocks expanded for cuBLAS at load (f14.; the faster serves):")
            for choice in mmq:
                say(f"  {choice}")

    # Constrained decoding: the bench's own ratio lines.
    ratios = [l.strip() for l in read_text(args.smol_json_log).splitlines()
              if "constrained/unconstrained" in l]
    if ratios:
        say("")
        say("SmolLM2 under a JSON schema, grammar masks applied on the GPU (c3.):")
        for line in ratios:
            say(f"  {line}")

    # Prefill attention kernels on a long prompt: prefill tokens/s and time to first token.
    tensor, f32 = (parse_fallow(read_text(log)) for log in (args.prefill_mma_log, args.prefill_f32_log))
    if tensor or f32:
        say("")
        say("8B shape, one 4096-token prompt: prefill attention on tensor cores vs f32 (f6.)")
        say(f"{'kernel':>8} {'prefill tok/s':>14} {'TTFT ms':>9}")
        for name, rows in (("mma", tensor), ("f32", f32)):
            row = rows.get(1)
            say(f"{name:>8} {fmt(row[0] if row else None):>14} {fmt(row[3] if row else None):>9}")
        if 1 in tensor and 1 in f32:
            say(f"  mma / f32 prefill tok/s = {fmt(ratio(tensor[1][0], f32[1][0]), '.2f')}")

    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    ap.add_argument("--gib", type=int, default=4)
    ap.add_argument("--iters", type=int, default=10)
    s = sub.add_parser("summary", help="the benchmark summary of gpu-check.sh")
    s.add_argument("--fallow-log")
    s.add_argument("--hf-log")
    s.add_argument("--bytes-per-step")
    s.add_argument("--bandwidth-gbs", type=float)
    s.add_argument("--steps", help="TSV of step name and status")
    s.add_argument("--q8-log", help="f4.: the 8B shape's bench with Q8_0 weights")
    s.add_argument("--q4k-log", help="f13.: the 8B shape's bench with Q4_K weights")
    s.add_argument("--q4k-int8-log",
                   help="f14.: the same with x rounded to int8 (FALLOW_CUDA_QUANT_X=int8)")
    s.add_argument("--q8-int8-log",
                   help="f14.: Q8_0 weights with x rounded to int8 (FALLOW_CUDA_QUANT_X=int8)")
    s.add_argument("--smol-bf16-log", help="c2.: SmolLM2's bench with bf16 weights")
    s.add_argument("--smol-quant-log", help="c2.: SmolLM2's bench with its own blocks")
    s.add_argument("--smol-int8-log",
                   help="c2.: the same with x rounded to int8 (FALLOW_CUDA_QUANT_X=int8)")
    s.add_argument("--smol-json-log", help="c3.: SmolLM2's bench with --json-schema")
    s.add_argument("--smol-sampled-log", help="c4.: SmolLM2's bench sampled with top-p 0.9")
    s.add_argument("--plain-log", help="f5.: the 8B shape's bench without early starts")
    s.add_argument("--split-norm-log",
                   help="f15.: the 8B shape's bench with FALLOW_CUDA_SPLIT_NORM=1")
    s.add_argument("--separate-norm-log",
                   help="f7.: the 8B shape's bench with add_rms_norm and qkv_prepare launched")
    s.add_argument("--no-prefetch-log",
                   help="f8.: the 8B shape's bench with FALLOW_CUDA_DEBUG=no-l2-prefetch")
    s.add_argument("--gated-down-log",
                   help="f9.: the 8B shape's bench with FALLOW_CUDA_DEBUG=no-fused-glu")
    s.add_argument("--split256-log",
                   help="f10.: the 8B shape's bench with FALLOW_CUDA_DEBUG=split-min-keys=256")
    s.add_argument("--cuda-cores-log",
                   help="f11.: the 8B shape's bench with FALLOW_CUDA_DEBUG=no-tensor-gemv")
    s.add_argument("--gemv-only-log",
                   help="f12.: the 8B shape's bench with FALLOW_CUDA_DEBUG=no-gemv-cublas")
    s.add_argument("--prefill-mma-log", help="f6.: a long prompt, tensor-core prefill attention")
    s.add_argument("--prefill-f32-log", help="f6.: the same prompt, f32 prefill attention")
    s.add_argument("--out", help="also write the summary here")
    args = ap.parse_args()
    if args.cmd == "summary":
        summary(args)
    else:
        measure(args.gib, args.iters)
    return 0


if __name__ == "__main__":
    sys.exit(main())
