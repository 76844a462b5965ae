"""A training step from a Python loop through xfmr against the same loop in
PyTorch (benchmark/pytorch_reference.py's model) and against the C++ step
(xfmr-bench), preset by preset, alternating the three each round:

  PYTHONPATH=build/release/python python3 benchmark/python_train.py build/release/benchmark/xfmr-bench \
      [--models shakespeare-small,shakespeare-mid,shakespeare-large] [--rounds 3] [--min-time 2]

Each does what pytorch_reference.py's train mode does: the preset's batch
of random ids (vocabulary 65) and targets at its full context, AdamW (lr
1e-4, betas 0.9 and 0.999, weight decay 0.01), no clipping. The table has
each side's median step over every round's samples; "Python / C++" is what
the Python call adds to xfmr-bench's train_step. PyTorch runs under
/usr/bin/python3 with OPENBLAS_NUM_THREADS=1, its default threads.
BENCHMARKS.md (History: "a training step from Python") has the numbers.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import xfmr

HERE = Path(__file__).resolve().parent
BATCH = {"tiny": 16, "shakespeare-small": 16, "names": 16, "shakespeare-mid": 16, "shakespeare-large": 64}


def python_steps(preset, min_time, warmup=3, vocab=65):
    model = xfmr.create(preset, vocab=vocab, seed=1337)
    b, t = BATCH[preset], model.config["dims"]["max_t"]
    rng = np.random.default_rng(1)
    ids = rng.integers(0, vocab, (b, t), dtype=np.int32)
    targets = rng.integers(0, vocab, (b, t), dtype=np.int32)
    trainer = xfmr.Trainer(model, lr=1e-4, schedule="constant", steps=10**9, beta2=0.999, weight_decay=0.01, clip=0)
    for _ in range(warmup):
        trainer.step(ids, targets)
    samples, start = [], time.perf_counter()
    while time.perf_counter() - start < min_time or len(samples) < 10:
        t0 = time.perf_counter()
        trainer.step(ids, targets)
        samples.append(time.perf_counter() - t0)
    return samples


def run_json(cmd, env=None):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run(cmd + ["--json", f.name], check=True, capture_output=True, env=env)
        return json.load(open(f.name))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bench")
    p.add_argument("--models", default="shakespeare-small,shakespeare-mid,shakespeare-large")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-time", type=float, default=2.0)
    a = p.parse_args()
    torch_env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    print(f"{'model':20s}{'xfmr C++':>12s}{'xfmr Python':>14s}{'PyTorch':>12s}{'Python / C++':>15s}"
          f"{'PyTorch / Python':>18s}")
    for preset in a.models.split(","):
        cpp, py, torch = [], [], []
        for _ in range(a.rounds):
            r = run_json([a.bench, "--model", preset, "--modes", "train", "--min-time", str(a.min_time)])
            cpp.append(r["results"]["train_step"]["median_ms"])
            py += python_steps(preset, a.min_time)
            r = run_json(["/usr/bin/python3", str(HERE / "pytorch_reference.py"), "--model", preset, "--modes", "train",
                          "--min-time", str(a.min_time)], torch_env)
            torch.append(r["results"]["train_step"]["median_ms"])
        c, q, t = statistics.median(cpp), statistics.median(py) * 1e3, statistics.median(torch)
        print(f"{preset:20s}{c:10.3f}ms{q:12.3f}ms{t:10.3f}ms{(q / c - 1) * 100:+14.1f}%{t / q:17.2f}x")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
