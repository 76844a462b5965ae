#!/usr/bin/python3
"""A LoRA training step, xfmr against plain PyTorch, in alternating rounds.

    benchmark/lora_compare.py CHECKPOINT SHAPE [--rank 16] [--batch 4] [--seq-len 256]
        [--rounds 2] [--precisions fp32,bf16] [--recompute none,block] [--torch-precisions fp32,bf16]
        [--torch-threads 1,2]

CHECKPOINT is random_checkpoint.py SHAPE's directory (float32 weights), e.g.
    benchmark/random_checkpoint.py tinyllama-1.1b /tmp/tl
xfmr times `xfmr-bench --pretrained CHECKPOINT --lora r=R,alpha=2R` in each of
--precisions (bf16, int8, q4: the base held as such copies, the forward
through them, the rest float32) under each --recompute mode; PyTorch times pytorch_reference.py --lora SHAPE (the same
shape, random weights, LoRA written in plain PyTorch) with its frozen base in
each --torch-precisions and under each thread count. Each round runs every
one of them once (A B C ... A B C ...), so that drift in the machine hits all
alike; each setting's step samples are pooled over the rounds. Both run under
one OpenBLAS setting, chosen as benchmark/compare chooses it.

Prints a Markdown table: the median step, tokens a second, the process's
peak resident set (getrusage's maximum, /usr/bin/time -v's number) against
the base's weights, the load or build time; and xfmr's speed-up over the
best PyTorch thread setting of each base precision.
"""
import argparse
import importlib.util
import os
import platform
import statistics
import sys
from datetime import date
from importlib.machinery import SourceFileLoader
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from random_checkpoint import SHAPES  # noqa: E402

_loader = SourceFileLoader("compare", str(HERE / "compare"))
compare = importlib.util.module_from_spec(importlib.util.spec_from_loader("compare", _loader))
_loader.exec_module(compare)


def base_bytes(shape, element_bytes):
    """The weights' bytes of a Llama shape (untied head)."""
    _, d, h, kv, layers, ff, v = shape
    per_layer = 2 * d * d + 2 * d * (kv * d // h) + 3 * d * ff + 2 * d
    return element_bytes * (layers * per_layer + 2 * v * d + d)


def cpu_name():
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return names[0] if names else platform.machine()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("--bench", default=str(HERE.parent / "build/release/benchmark/xfmr-bench"))
    p.add_argument("--python", default="/usr/bin/python3", help="a python3 with torch")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--min-reps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--recompute", default="none,block")
    p.add_argument("--torch-precisions", default="fp32,bf16")
    p.add_argument("--torch-threads", default="1,2")
    p.add_argument("--openblas", default="probe", choices=["probe", "as-set", "detected"])
    args = p.parse_args()
    compare.prepare(args)
    env, openblas = compare.choose_openblas(args.python, dict(os.environ, OPENBLAS_NUM_THREADS="1"), args.openblas)
    common = ["--batch", str(args.batch), "--seq-len", str(args.seq_len), "--min-reps", str(args.min_reps),
              "--min-time", "0", "--warmup", str(args.warmup)]
    impls = {}
    for precision in args.precisions.split(","):
        for mode in args.recompute.split(","):
            impls[f"xfmr {precision} recompute {mode}"] = [
                args.bench, "--pretrained", args.checkpoint, "--lora", f"r={args.rank},alpha={2 * args.rank}",
                "--precision", precision, "--recompute", mode] + common
    for precision in args.torch_precisions.split(","):
        for t in args.torch_threads.split(","):
            impls[f"pytorch {precision} {t}t"] = [args.python, str(HERE / "pytorch_reference.py"), "--lora", args.shape,
                                                  "--rank", str(args.rank), "--precision", precision,
                                                  "--threads", t] + common
    samples = {name: [] for name in impls}
    meta = {}
    for r in range(args.rounds):
        for name, cmd in impls.items():
            print(f"[lora] round {r + 1}/{args.rounds}: {name}", file=sys.stderr, flush=True)
            out = compare.run(cmd, env)
            samples[name] += out["results"]["train_step"]["samples_ms"]
            meta[name] = out
            print(f"[lora] {name}: {statistics.median(out['results']['train_step']['samples_ms']):.0f} ms, "
                  f"peak RSS {out['memory']['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    shape = SHAPES[args.shape]
    tokens = args.batch * args.seq_len
    # (int8: a byte a weight and its rows' scales, ~1; q4: 18 bytes a block of 32.)
    base_gb = {p: base_bytes(shape, b) / 1e9 for p, b in (("fp32", 4), ("bf16", 2), ("int8", 1), ("q4", 18 / 32))}
    x = meta[next(iter(impls))]
    print(f"\nLoRA r{args.rank} alpha {2 * args.rank} on q, k, v, o, gate, up, down of {args.shape} "
          f"(random weights; {x['lora']['trained']:,} trained of {x['parameters']:,}), B{args.batch} T{args.seq_len}; "
          f"{date.today().isoformat()}, {cpu_name()}, {os.cpu_count()} CPUs; "
          f"OpenBLAS {openblas['setting']}: xfmr {x['blas']}, kernels {x['cpu_kernels']}; "
          f"PyTorch {meta[list(impls)[-1]]['torch']}, {meta[list(impls)[-1]]['blas']}")
    print("| setting | step (median) | tokens/s | peak RSS | RSS / base weights | load |")
    print("|---|---|---|---|---|---|")
    medians = {name: statistics.median(s) for name, s in samples.items()}
    for name in impls:
        m = meta[name]
        precision = name.split()[1]
        rss_gb = m["memory"]["peak_rss_mb"] / 1e3
        print(f"| {name} | {medians[name]:.0f} ms | {tokens / (medians[name] / 1e3):.0f} | {rss_gb:.2f} GB | "
              f"{rss_gb / base_gb[precision]:.2f}x {precision} ({base_gb[precision]:.2f} GB) | "
              f"{m['load']['load_s']:.1f} s |")
    for precision in args.torch_precisions.split(","):
        mine = [n for n in impls if n.startswith(f"xfmr {precision} ")]
        if not mine:
            continue
        fastest = min(mine, key=medians.get)
        best = min((n for n in impls if n.startswith(f"pytorch {precision} ")), key=medians.get)
        print(f"{fastest} against {best} (PyTorch's best, base {precision}): "
              f"{medians[best] / medians[fastest]:.2f}x")


if __name__ == "__main__":
    main()
