#!/usr/bin/env python3
"""xfmr and llama.cpp side by side on the same GGUF files, as llama-bench
measures (tg: generated tokens one at a time from BOS; pp: a prompt in one
batch; a warm-up, then repetitions), with each one's load time, time to the
first token and peak memory (/usr/bin/time -v's maximum resident set, in a
run of its own without the prompt).

    llama_cpp.py BUILD PREFIX [--types f32,f16,q8_0,q4_0] [--rounds 2]
                 [--tg 128] [--pp 512] [--work DIR]

PREFIX-TYPE.gguf are the files (xfmr-lm export --gguf FILE --type TYPE of a
benchmark/random_checkpoint.py model: the same random weights in each
type). xfmr reads each in the precision of its row (F32 fp32, F16 bf16,
Q8_0 int8, Q4_0 q4); llama.cpp runs through node-llama-cpp 3.21.1
(installed in --work with npm ci from test/llama_cpp's lock file) at 1 and 2
threads, the faster of the two counted for each measure: on 2 vCPUs its
two compute threads share them with Node's own, and one thread decodes
faster than two there. xfmr and llama.cpp alternate, type by type, for
--rounds rounds; each cell is the median of its rounds. Prints a Markdown
table."""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_size import bench, take_option  # noqa: E402  xfmr-bench --pretrained, timed and measured

PRECISION = {"f32": "fp32", "f16": "bf16", "bf16": "bf16", "q8_0": "int8", "q4_0": "q4"}
HERE = Path(__file__).resolve().parent


def install(work):
    work.mkdir(parents=True, exist_ok=True)
    lock = HERE.parent / "test" / "llama_cpp" / "package-lock.json"
    for f in ("package.json", "package-lock.json"):
        (work / f).write_bytes((lock.parent / f).read_bytes())
    (work / "llama_cpp.mjs").write_bytes((HERE / "llama_cpp.mjs").read_bytes())
    stamp = work / "node_modules" / ".xfmr-lock"
    if stamp.exists() and stamp.read_bytes() == lock.read_bytes():
        return
    env = dict(os.environ, NODE_LLAMA_CPP_SKIP_DOWNLOAD="true")
    subprocess.run(["npm", "ci", "--omit=optional", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=work, env=env,
                   check=True, capture_output=True)
    stamp.write_bytes(lock.read_bytes())


def llama_cpp(work, model, threads, tg, pp, reps):
    cmd = ["/usr/bin/time", "-v", "node", "llama_cpp.mjs", model, str(threads), str(tg), str(pp), str(reps)]
    run = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{run.stdout}{run.stderr}")
    r = json.loads(run.stdout.strip().splitlines()[-1])
    r["peak_gb"] = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr).group(1)) * 1024 / 1e9
    return r


def main():
    args = sys.argv[1:]
    option = lambda name, default: take_option(args, name, default)

    types = option("--types", "f32,f16,q8_0,q4_0").split(",")
    rounds, tg, pp = int(option("--rounds", "2")), int(option("--tg", "128")), int(option("--pp", "512"))
    work = Path(option("--work", tempfile.gettempdir() + "/xfmr-llama-cpp"))
    build, prefix = args
    install(work)
    cells = {t: {} for t in types}

    def add(t, key, value):
        if value is not None:
            cells[t].setdefault(key, []).append(value)

    for _ in range(rounds):
        for t in types:
            model = f"{prefix}-{t}.gguf"
            x = bench(build, model, PRECISION[t], "best", tg, pp)  # speed, with the prompt
            add(t, "x_ms", x["ms"]), add(t, "x_pp", x["prefill_tps"])
            m = bench(build, model, PRECISION[t], "best", tg, 0)  # memory, without
            add(t, "x_gb", m["peak_gb"]), add(t, "x_load", m["load_s"]), add(t, "x_first", m["first_token_s"])
            best = {}
            for threads in (1, 2):
                r = llama_cpp(work, model, threads, tg, pp, 2)
                best.setdefault("ms", []).append((statistics.mean(r["tg_ms"]), threads))
                best.setdefault("pp", []).append((statistics.mean(r["pp_tps"]), threads))
                best.setdefault("load", []).append(r["load_s"])
                best.setdefault("first", []).append(r["first_s"])
            m = llama_cpp(work, model, 2, tg, 0, 1)
            add(t, "l_ms", min(best["ms"])), add(t, "l_pp", max(best["pp"]))
            add(t, "l_gb", m["peak_gb"]), add(t, "l_load", min(best["load"])), add(t, "l_first", min(best["first"]))
            print(f"{t}: {cells[t]}", file=sys.stderr, flush=True)

    def med(t, key):
        v = cells[t][key]
        return statistics.median(x[0] if isinstance(x, tuple) else x for x in v)

    def threads(t, key):
        return "/".join(sorted({str(x[1]) for x in cells[t][key]}))

    print(f"| file type (xfmr precision) | decode ms a token, xfmr / llama.cpp (threads) | prompt of {pp} tokens/s, "
          "xfmr / llama.cpp (threads) | peak memory GB, xfmr / llama.cpp | load + first token s, xfmr / llama.cpp |")
    print("|---|---|---|---|---|")
    for t in types:
        print(f"| {t.upper()} ({PRECISION[t]}) | {med(t, 'x_ms'):.1f} / {med(t, 'l_ms'):.1f} ({threads(t, 'l_ms')}) | "
              f"{med(t, 'x_pp'):.0f} / {med(t, 'l_pp'):.0f} ({threads(t, 'l_pp')}) | "
              f"{med(t, 'x_gb'):.2f} / {med(t, 'l_gb'):.2f} | "
              f"{med(t, 'x_load') + med(t, 'x_first'):.2f} / {med(t, 'l_load') + med(t, 'l_first'):.2f} |")


if __name__ == "__main__":
    main()
