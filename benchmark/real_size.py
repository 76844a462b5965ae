#!/usr/bin/env python3
"""A model at its real size (a checkpoint xfmr-bench --pretrained reads:
random_checkpoint.py writes published shapes), in each decoding precision:
the load, the time to the first token (the precision's copies made from
the file), the decoding speed, a prompt's speed and the process's peak
memory (/usr/bin/time -v's maximum resident set), in alternating rounds;
each cell the median of its rounds.

    real_size.py BUILD MODEL [--precisions fp32,bf16,int8,q4] [--levels best]
                 [--rounds 2] [--tokens 64] [--prefill 512]

--levels avx512,avx2 forces each level in turn (XFMR_CPU_LEVEL), for
4-bit against int8 at each. Peak memory is measured in runs of their own
(xfmr-bench --memory, no prompt): the prompt's logits and the bench's
own measurements would count in it otherwise. Prints a Markdown table."""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def bench(build, model, precision, level, tokens, prefill):
    env = dict(os.environ)
    if level != "best":
        env["XFMR_CPU_LEVEL"] = level
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = ["/usr/bin/time", "-v", f"{build}/benchmark/xfmr-bench", "--pretrained", model, "--decode-tokens",
               str(tokens), "--precision", precision, "--min-reps", "3", "--min-time", "0", "--warmup", "1",
               "--json", out.name]
        cmd += ["--prefill", str(prefill)] if prefill else ["--memory"]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{run.stdout}{run.stderr}")
        result = json.load(open(out.name))
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", run.stderr).group(1))
    r = result["results"]
    return {"load_s": result["load"]["load_s"], "first_token_s": result["load"]["first_token_s"],
            "ms": r["generate_cached"]["median_ms"], "peak_gb": rss_kb * 1024 / 1e9,
            "prefill_tps": r["prefill"]["tokens_per_s"] if "prefill" in r else None,
            "kernels": result.get("cpu_kernels", "")}


def take_option(args, name, default):
    """The value after `name` in args (both taken out of it), or default."""
    if name in args:
        i = args.index(name)
        value = args[i + 1]
        del args[i:i + 2]
        return value
    return default


def main():
    args = [a for a in sys.argv[1:]]
    option = lambda name, default: take_option(args, name, default)
    precisions = option("--precisions", "fp32,bf16,int8,q4").split(",")
    levels = option("--levels", "best").split(",")
    rounds, tokens, prefill = int(option("--rounds", "2")), int(option("--tokens", "64")), int(option("--prefill", "512"))
    if len(args) != 2:
        sys.exit(__doc__)
    build, model = args
    runs = {}
    for r in range(rounds):
        for level in levels:
            for p in precisions:
                m = bench(build, model, p, level, tokens, 0)
                if prefill:
                    m["prefill_tps"] = bench(build, model, p, level, tokens, prefill)["prefill_tps"]
                runs.setdefault((level, p), []).append(m)
                print(f"round {r + 1}, {level}, {p}: {m}", file=sys.stderr, flush=True)
    med = lambda v: statistics.median(v)
    prompt_column = f" prompt of {prefill}, tokens/s |" if prefill else ""
    print(f"| kernels | precision | load | first token | peak memory | decode, ms a token | tokens/s |{prompt_column}")
    print("|---|---|---|---|---|---|---|" + ("---|" if prefill else ""))
    for (level, p), ms in runs.items():
        tps = [1e3 / m["ms"] for m in ms]
        pre = [m["prefill_tps"] for m in ms if m["prefill_tps"]]
        decode = ", ".join("%.1f" % m["ms"] for m in ms)
        prompt = f" {med(pre):.0f} |" if pre else ""
        print(f"| {ms[0]['kernels']} | {p} | {med([m['load_s'] for m in ms]):.2f} s | "
              f"{med([m['first_token_s'] for m in ms]):.2f} s | {med([m['peak_gb'] for m in ms]):.2f} GB | "
              f"{decode} | {med(tps):.1f} |{prompt}")


if __name__ == "__main__":
    main()
