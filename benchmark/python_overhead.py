"""What a generated token costs through the Python module against the same
decoding in C++ (xfmr-bench --pretrained), in one run:

  PYTHONPATH=build/release/python python3 benchmark/python_overhead.py \
      build/release/benchmark/xfmr-bench MODEL [--tokenizer T] [--tokens N]

A small model (the fixtures' families/smollm2: some 6 us a token) shows the
overhead best. generate() and stream() draw greedy tokens past the end
token; a token's cost is the difference between a call of N tokens and one
of 1, over N - 1, the best of five rounds. BENCHMARKS.md (History: "a token through the Python module") has
the numbers.
"""
import argparse
import re
import subprocess
import time

import xfmr


def per_token(call, tokens, reps):
    def best(n):
        out = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(reps):
                call(n)
            out = min(out, (time.perf_counter() - t0) / reps)
        return out

    one, many = best(1), best(tokens)
    return (many - one) / (tokens - 1), one


def main():
    p = argparse.ArgumentParser()
    p.add_argument("xfmr_bench")
    p.add_argument("model")
    p.add_argument("--tokenizer", help="for stream(), when the model has none of its own")
    p.add_argument("--tokens", type=int, default=60)
    p.add_argument("--reps", type=int, default=100)
    a = p.parse_args()

    out = subprocess.run([a.xfmr_bench, "--pretrained", a.model, "--decode-tokens", str(a.tokens)],
                         capture_output=True, text=True, check=True).stdout
    ms = float(re.search(r"generate_cached\s+([0-9.]+) ms", out).group(1))
    print(out.splitlines()[0])
    print(f"C++ (xfmr-bench generate_cached)  {ms * 1e3:8.2f} us a token")

    m = xfmr.load(a.model, tokenizer=a.tokenizer)
    prompt = [1]
    t, call = per_token(lambda n: m.generate(prompt, max_tokens=n, temperature=0, ignore_eos=True), a.tokens, a.reps)
    print(f"Python generate()                 {t * 1e6:8.2f} us a token  (a call of one token: {call * 1e6:.1f} us)")
    if m.tokenizer is not None:
        t, call = per_token(lambda n: list(m.stream(prompt, max_tokens=n, temperature=0, ignore_eos=True)),
                            a.tokens, a.reps)
        print(f"Python stream()                   {t * 1e6:8.2f} us a token  (a call of one token: {call * 1e6:.1f} us)")


if __name__ == "__main__":
    main()
