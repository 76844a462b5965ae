#!/usr/bin/env python3
"""llama.cpp and xfmr on the same GGUF files (run by run.sh, ctest
llama_cpp_agreement). llama.cpp runs through node-llama-cpp (greedy.mjs).

    agreement.py XFMR_LM WORK_DIR

Reading: random models of each architecture (llama, qwen2, gpt2) and type
(F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K), written by test/reference/random_gguf.py (not
by xfmr). xfmr reads each in the precision its matrices ask for
(io/gguf_model.hpp's gguf_precision) and must give llama.cpp's prompt ids
(the tokenizer in the file), its next-token probabilities within the type's
error, and its greedy ids through the library and through `xfmr-lm sample`
(Q8_0's, Q4_K's and Q6_K's in fp32: below).

Writing: models trained by xfmr a few steps (Llama-, Qwen2-, GPT-2-shaped,
and a Llama with Llama 3's rope scaling), exported with export_gguf in each
type: llama.cpp's greedy ids equal xfmr's own (F32, F16, BF16) and its
probabilities agree within the type's error (every type).
"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import xfmr

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "reference"))
import random_gguf  # noqa: E402

PROMPT = "the cat sat on the mat and"
N = 16
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0"]  # written (export_gguf's)
READ_TYPES = TYPES + ["q4_k", "q6_k"]
# Types xfmr quantises again to decode in their default precision (int8 rows
# with a scale a row, or 4-bit blocks from the decoded values): their greedy
# ids are checked in fp32, which holds the file's values exactly.
REQUANTISED = ("q8_0", "q4_k", "q6_k")
# The most a next-token probability may differ from llama.cpp's: the
# type's rounding of the weights (and of xfmr's or llama.cpp's activations).
# llama.cpp keeps its key/value cache in F16, whatever the weights' type.
TOLERANCE = {"f32": 1e-3, "f16": 2e-2, "bf16": 2e-2, "q8_0": 3e-2, "q4_0": 6e-2, "q4_k": 3e-2, "q6_k": 3e-2}
# The requantised types in their default precision: the file's error and
# xfmr's second rounding (Q4_K's asymmetric 6-bit-scaled blocks into
# symmetric 4-bit ones: near-tied top tokens of a random qwen2 move by 0.25).
REQUANTISED_TOLERANCE = {"q8_0": 3e-2, "q4_k": 0.3, "q6_k": 0.2}

lm, work = sys.argv[1], Path(sys.argv[2])
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what, flush=True)
    if not ok:
        failures.append(what)


def llama_cpp(paths):
    """llama.cpp's reading of each file, by path (one process for all)."""
    out = subprocess.run(["node", str(work / "greedy.mjs"), PROMPT, str(N)] + [str(p) for p in paths], cwd=work,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"llama.cpp: {out.stderr}")
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["file"]: r for r in results}


def until_end(ids, ends):
    """ids up to the first end id (llama.cpp's greedy does not stop; xfmr's does)."""
    for i, t in enumerate(ids):
        if t in ends:
            return ids[:i]
    return ids


def probabilities(model, ids):
    logits = np.asarray(model.logits(ids), dtype=np.float64)[-1]
    p = np.exp(logits - logits.max())
    return p / p.sum()


def compare_probabilities(model, ref, what, tolerance):
    ours = probabilities(model, ref["prompt"])
    theirs = np.zeros_like(ours)
    for token, p in ref["probabilities"]:
        theirs[token] = p
    worst = float(np.abs(ours - theirs).max())
    check(worst <= tolerance, f"{what}: next-token probabilities within {tolerance} of llama.cpp's (worst {worst:.2e})")


def reading(arch, type_name, ref):
    path = work / f"random-{arch}-{type_name}.gguf"
    model = xfmr.load(path)
    what = f"read {arch} {type_name}"
    tok = model.tokenizer
    check(tok.encode(PROMPT) == ref["prompt"], f"{what}: prompt ids {tok.encode(PROMPT)} == llama.cpp's {ref['prompt']}")
    compare_probabilities(model, ref, f"{what} ({model.config['precision']})",
                          REQUANTISED_TOLERANCE.get(type_name, TOLERANCE[type_name]))
    # Greedy ids in the file's precision, but the requantised types': their
    # weights moved (Q8_0's int8 rows, a scale a row, from 32-weight blocks)
    # part from llama.cpp's after a few tokens of a random model.
    precision = "fp32" if type_name in REQUANTISED else None
    if precision:
        model = xfmr.load(path, precision=precision)
    what += f" ({model.config['precision']})"
    if precision:
        compare_probabilities(model, ref, what, TOLERANCE[type_name])
    ends = {1, 2} if arch == "llama" else {len(tok) - 1}
    want = until_end(ref["greedy"], ends)
    got = model.generate(ref["prompt"], max_tokens=N, temperature=0).ids
    check(until_end(got, ends) == want, f"{what}: greedy ids {got} == llama.cpp's {want}")
    sample = subprocess.run([lm, "sample", "--model", str(path), "--prompt", PROMPT, "--tokens", str(N),
                             "--temperature", "0"] + (["--precision", precision] if precision else []),
                            capture_output=True)
    text = sample.stdout.decode("utf-8", "replace").rstrip("\n")
    expected = PROMPT + tok.decode(want)
    check(sample.returncode == 0 and text == expected.encode("utf-8", "replace").decode("utf-8", "replace"),
          f"{what}: xfmr-lm sample gives {text!r}, llama.cpp's tokens {expected!r}")


def writing(name, config, tokenizer):
    """The exports of a model xfmr trained, and its own greedy ids and model."""
    model = xfmr.create(config, tokenizer=tokenizer, seed=3)
    trainer = xfmr.Trainer(model, lr=1e-2, steps=40)
    text = model.tokenizer.encode(" ".join(["the cat sat on the mat and the dog ran in the sun"] * 20))
    batch = np.array([text[i:i + 33] for i in range(0, 4 * 40, 40)])
    for _ in range(40):
        trainer.step(batch)
    ids = model.tokenizer.encode(PROMPT)
    ours = model.generate(ids, max_tokens=N, temperature=0, ignore_eos=True).ids
    paths = []
    for type_name in TYPES:
        paths.append(work / f"trained-{name}-{type_name}.gguf")
        model.export_gguf(paths[-1], type_name, overwrite=True)
    return model, ids, ours, paths


def written(name, model, ids, ours, type_name, ref):
    what = f"write {name} {type_name}"
    check(ref["prompt"] == ids, f"{what}: llama.cpp's prompt ids {ref['prompt']} == xfmr's {ids}")
    if type_name in ("f32", "f16", "bf16"):
        check(ref["greedy"] == ours, f"{what}: llama.cpp's greedy ids {ref['greedy']} == xfmr's {ours}")
    compare_probabilities(model, ref, what, TOLERANCE[type_name])


files = {}
for arch in ("llama", "qwen2", "gpt2"):
    for type_name in READ_TYPES:
        files[(arch, type_name)] = work / f"random-{arch}-{type_name}.gguf"
        random_gguf.main(arch, type_name, str(files[(arch, type_name)]), 75)
refs = llama_cpp(files.values())
for (arch, type_name), path in files.items():
    reading(arch, type_name, refs[str(path)])

tokenizer = HERE.parent / "reference" / "fixtures" / "lm" / "tokenizer.json"
families = HERE.parent / "reference" / "fixtures" / "families"
exports = []
for name, family in (("llama", "smollm2"), ("llama3-scaled", "llama3-scaled"), ("qwen2", "qwen2"),
                     ("gpt2", "gpt2-ctx2048")):
    config = xfmr.load(families / family).config  # the family's parts and knobs, at a width of whole blocks
    dims = config["dims"]
    dims.update(d_model=64, n_heads=4, d_ff=96, max_t=128)
    dims["n_kv_heads"] = 4 if family.startswith("gpt2") else 2
    exports.append((name,) + writing(name, config, tokenizer))
refs = llama_cpp([p for e in exports for p in e[4]])
for name, model, ids, ours, paths in exports:
    for type_name, path in zip(TYPES, paths):
        written(name, model, ids, ours, type_name, refs[str(path)])

if failures:
    print(f"{len(failures)} of the checks failed")
    sys.exit(1)
print("llama.cpp and xfmr agree")
