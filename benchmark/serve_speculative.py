#!/usr/bin/env python3
"""xfmr-serve's speculative decoding: the generation speed of one stream
with prompt lookup (--lookup K) and with a draft model (--draft PATH
--draft-tokens K) against plain decoding, the drafts drawn as drafted,
and each server's load time and peak memory.

    serve_speculative.py BUILD MODEL [--tokenizer PATH] [--draft PATH]
                         [--lookup 4] [--draft-tokens 4] [--task repeat|continue]
                         [--requests 8] [--max-tokens 128] [--rounds 2] [--passage 250]

The prompts come from the last tenth of --corpus (default:
../shared/data/tinyshakespeare.txt), a passage of up to --passage
characters each (whole lines). --task repeat (input-grounded): the passage, a blank line, and its
first line again: the model is asked to go on repeating what it was
given. --task continue: the passage alone. Each server (plain, lookup,
draft) answers the same greedy requests one at a time; each round starts
every server afresh, in that order. Prints, for each server, the median
of the rounds' generation tokens/s (the `timings` the server reports:
tokens after the first over the seconds after it), the drafts drawn as
drafted (/metrics), the load time (start to listening with the model
loaded) and the peak RSS (VmHWM, as /usr/bin/time -v gives it), and
whether every answer equals plain decoding's."""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def start(build, model, tokenizer, extra):
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [f"{build}/server/xfmr-serve", "--model", model, "--port", "0", "--slots", "1"] + extra
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stderr=log)
    for _ in range(3000):
        text = open(log.name).read()
        port = re.search(r"listening on http://127.0.0.1:(\d+)/", text)
        if port and "slots of" in text:
            return proc, int(port.group(1)), time.perf_counter() - t0, log.name
        if proc.poll() is not None:
            sys.exit(f"xfmr-serve failed:\n{text}")
        time.sleep(0.02)
    sys.exit("xfmr-serve did not start")


def stop(proc, log):
    """Stops the server: its peak RSS in MiB (the kernel's VmHWM, what /usr/bin/time -v reports)."""
    with open(f"/proc/{proc.pid}/status") as f:
        rss = int(re.search(r"VmHWM:\s+(\d+) kB", f.read()).group(1)) / 1024
    proc.terminate()
    proc.wait()
    os.unlink(log)
    return rss


def request(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, json.dumps(body) if body else None, {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    if r.status != 200:
        sys.exit(f"{path}: {r.status} {data[:300]}")
    return data


def metric(text, name):
    m = re.search(rf"\nxfmr_{name} ([0-9.e+]+)\n", text)
    return float(m.group(1)) if m else 0.0


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("build")
    a.add_argument("model")
    a.add_argument("--tokenizer", default="")
    a.add_argument("--draft", default="", help="the draft model (none: plain and lookup only)")
    a.add_argument("--draft-precision", default="")
    a.add_argument("--lookup", type=int, default=4)
    a.add_argument("--draft-tokens", type=int, default=4)
    a.add_argument("--task", choices=["repeat", "continue"], default="repeat")
    a.add_argument("--requests", type=int, default=8)
    a.add_argument("--max-tokens", type=int, default=128)
    a.add_argument("--rounds", type=int, default=2)
    a.add_argument("--passage", type=int, default=250, help="characters of a prompt's passage, at most")
    a.add_argument("--corpus", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                    "tinyshakespeare.txt"))
    o = a.parse_args()
    text = open(o.corpus, encoding="utf-8").read()
    held_out = text[len(text) * 9 // 10:]
    prompts = []
    for i in range(o.requests):
        at = held_out.find("\n\n", i * 2000) + 2  # a passage from the start of a speech
        passage = held_out[at:at + o.passage].rsplit("\n", 1)[0]
        prompts.append(passage + "\n\n" + passage.split("\n")[0] + "\n" if o.task == "repeat" else passage + "\n")
    servers = [("plain", [])]
    if o.lookup > 0:
        servers.append((f"lookup {o.lookup}", ["--lookup", str(o.lookup)]))
    if o.draft:
        extra = ["--draft", o.draft, "--draft-tokens", str(o.draft_tokens)]
        if o.draft_precision:
            extra += ["--draft-precision", o.draft_precision]
        servers.append((f"draft {o.draft_tokens}", extra))
    results = {name: {"speed": [], "load": [], "rss": [], "drawn": [], "same": True} for name, _ in servers}
    plain_texts = None
    for r in range(o.rounds):
        for name, extra in servers:
            proc, port, load, log = start(o.build, o.model, o.tokenizer, extra)
            tokens, seconds, texts = 0, 0.0, []
            for p in prompts:
                answer = json.loads(request(port, "POST", "/v1/completions",
                                            {"prompt": p, "max_tokens": o.max_tokens, "temperature": 0,
                                             "ignore_eos": True}))
                t = answer["timings"]
                tokens += t["predicted_n"] - 1  # the first comes with the prompt's step
                seconds += t["predicted_ms"] / 1e3
                texts.append(answer["choices"][0]["text"])
            m = request(port, "GET", "/metrics")
            drafted, accepted = metric(m, "draft_tokens_total"), metric(m, "draft_accepted_total")
            rss = stop(proc, log)
            if name == "plain":
                plain_texts = plain_texts or texts
            res = results[name]
            res["same"] &= texts == plain_texts
            res["speed"].append(tokens / seconds)
            res["load"].append(load)
            res["rss"].append(rss)
            res["drawn"].append(accepted / drafted if drafted else float("nan"))
            print(f"round {r + 1}, {name}: {tokens / seconds:.1f} tokens/s, {int(accepted)} of {int(drafted)} drafts "
                  f"drawn, load {load:.2f} s, peak RSS {rss:.0f} MiB", flush=True)
    base = statistics.median(results["plain"]["speed"])
    print(f"task {o.task}, {o.requests} requests of {o.max_tokens} greedy tokens, median of {o.rounds} rounds:")
    for name, _ in servers:
        res = results[name]
        speed = statistics.median(res["speed"])
        print(f"  {name:10s} {speed:8.1f} tokens/s ({speed / base:.2f}x), drafts drawn "
              f"{statistics.median(res['drawn']):.2f}, load {statistics.median(res['load']):.2f} s, "
              f"peak RSS {max(res['rss']):.0f} MiB, answers {'equal plain' if res['same'] else 'DIFFER'}")


if __name__ == "__main__":
    main()
