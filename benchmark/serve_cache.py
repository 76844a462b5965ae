#!/usr/bin/env python3
"""xfmr-serve's prompt cache: the time to the first token of a chat's
second turn, whose history (about HISTORY tokens) the first turn's slot
still holds, against the same request to a server that holds nothing.

    serve_cache.py BUILD MODEL [--tokenizer PATH] [--precision fp32]
                   [--history 1000] [--rounds 3] [--corpus FILE]

Each round starts a server, sends the first turn (the history and a
question, 32 greedy tokens, streamed), then the second (the history, the
answer, a new question) and times its first token: cached. Then it starts
a fresh server and sends the second turn alone: uncached. The text comes
from --corpus (default: ../shared/data/tinyshakespeare.txt). Prints each
round and the medians, with the cached tokens the server reported."""
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


def start(build, model, tokenizer, precision):
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [f"{build}/server/xfmr-serve", "--model", model, "--port", "0", "--slots", "4", "--context", "2048",
           "--precision", precision]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    proc = subprocess.Popen(cmd, stderr=log)
    for _ in range(1200):
        text = open(log.name).read()
        port = re.search(r"listening on http://127.0.0.1:(\d+)/", text)
        if port and "slots of" in text:
            return proc, int(port.group(1))
        if proc.poll() is not None:
            sys.exit(f"xfmr-serve failed:\n{text}")
        time.sleep(0.1)
    sys.exit("xfmr-serve did not start")


def stop(proc):
    proc.terminate()
    proc.wait()


def chat(port, messages):
    """Streams a chat completion: (seconds to the first token's event, the text, usage)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"messages": messages, "max_tokens": 32, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"chat: {r.status} {r.read()[:300]}")
    first, text, usage = None, "", None
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if event.get("usage"):
            usage = event["usage"]
        for choice in event.get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece and first is None:
                first = time.perf_counter() - t0
            text += piece or ""
    c.close()
    return first, text, usage


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("build")
    a.add_argument("model")
    a.add_argument("--tokenizer", default="")
    a.add_argument("--precision", default="fp32")
    a.add_argument("--history", type=int, default=1000, help="tokens of history, about (4 characters a token)")
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--corpus", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                    "tinyshakespeare.txt"))
    o = a.parse_args()
    words = open(o.corpus, encoding="utf-8").read().split()
    # The history: alternating turns of corpus text, about `history` tokens in all.
    history, at = [], 0
    while sum(len(m["content"]) for m in history) < o.history * 4:
        role = "user" if len(history) % 2 == 0 else "assistant"
        history.append({"role": role, "content": " ".join(words[at:at + 60])})
        at += 60
    if history[-1]["role"] == "assistant":
        history.append({"role": "user", "content": "What happens next?"})
    cached, uncached = [], []
    for r in range(o.rounds):
        proc, port = start(o.build, o.model, o.tokenizer, o.precision)
        _, answer, first_usage = chat(port, history)
        turn2 = history + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And then?"}]
        t_cached, _, usage = chat(port, turn2)
        stop(proc)
        proc, port = start(o.build, o.model, o.tokenizer, o.precision)
        t_uncached, _, usage_fresh = chat(port, turn2)
        stop(proc)
        cached.append(t_cached)
        uncached.append(t_uncached)
        print(f"round {r + 1}: first turn {first_usage['prompt_tokens']} prompt tokens; second turn "
              f"{usage['prompt_tokens']} tokens, {usage['prompt_tokens_details']['cached_tokens']} cached: "
              f"first token {t_cached * 1e3:.1f} ms, uncached {t_uncached * 1e3:.1f} ms "
              f"({usage_fresh['prompt_tokens_details']['cached_tokens']} cached)", flush=True)
    c, u = statistics.median(cached), statistics.median(uncached)
    print(f"median: cached {c * 1e3:.1f} ms, uncached {u * 1e3:.1f} ms: {c / u:.3f} of it ({u / c:.1f}x)")


if __name__ == "__main__":
    main()
