#!/usr/bin/env bash
# The gpt2-small check made on the fly: make_fixtures.py --gpt2-small writes
# a GPT-2 of gpt2-small's shape with random weights in the Hugging Face layout
# (about 500 MB) and the greedy continuation PyTorch decodes for a prompt
# (float64, with its own past_key_values-style cache); xfmr-lm sample
# must print the same text, token for token.
#
#   test_gpt2_small.sh XFMR_LM GPT2_DATA_DIR WORK_DIR
#
# Exits 77 (skipped) without Debian's python3 and python3-torch, or without
# the GPT-2 tokenizer files. XFMR_PYTHON names another python3 with torch;
# XFMR_BACKEND=cuda decodes on the GPU.
set -euo pipefail
lm=$1 data=$2 work=$3
script_dir=$(cd "$(dirname "$0")" && pwd)
python=${XFMR_PYTHON:-/usr/bin/python3}
if ! "$python" -c "import torch" 2>/dev/null; then echo "skipped: no python3-torch"; exit 77; fi
if [[ ! -f $data/encoder.json || ! -f $data/vocab.bpe || ! -f $data/reference.jsonl ]]; then
  echo "skipped: no GPT-2 tokenizer files in $data"; exit 77
fi
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# The prompt and its ids, from the reference encodings (Shakespeare's line).
read -r prompt_ids < <("$python" - "$data/reference.jsonl" "$work/prompt.txt" <<'PY'
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    r = json.loads(line)
    if r["text"].startswith("ROMEO"):
        open(sys.argv[2], "w", encoding="utf-8").write(r["text"])
        print(",".join(map(str, r["ids"])))
        break
PY
)
"$python" "$script_dir/make_fixtures.py" --gpt2-small "$work/gpt2" "$prompt_ids"

# The text PyTorch's greedy ids spell: GPT-2's byte-level decoding.
"$python" - "$data/encoder.json" "$work/gpt2/expected.json" "$work/prompt.txt" "$work/expected.txt" <<'PY'
import json, sys
byte_chars = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
chars, n = byte_chars[:], 0
for b in range(256):
    if b not in byte_chars:
        byte_chars.append(b)
        chars.append(256 + n)
        n += 1
to_byte = {chr(c): b for b, c in zip(byte_chars, chars)}
token = {i: t for t, i in json.load(open(sys.argv[1], encoding="utf-8")).items()}
greedy = json.load(open(sys.argv[2]))["greedy"]
text = open(sys.argv[3], "rb").read() + bytes(to_byte[c] for i in greedy for c in token[i]) + b"\n"
open(sys.argv[4], "wb").write(text)
PY

n=$("$python" -c "import json; print(len(json.load(open('$work/gpt2/expected.json'))['greedy']))")
"$lm" sample --model "$work/gpt2" --tokenizer "$data" --prompt "$(cat "$work/prompt.txt")" --tokens "$n" \
  --temperature 0 --backend "${XFMR_BACKEND:-cpu}" > "$work/got.txt" 2> "$work/speed.txt"
if ! cmp -s "$work/got.txt" "$work/expected.txt"; then
  echo "FAIL: xfmr's greedy text differs from PyTorch's"
  echo "--- PyTorch:"; cat "$work/expected.txt"
  echo "--- xfmr:"; cat "$work/got.txt"
  exit 1
fi
echo "ok: $n greedy tokens of a random gpt2-small agree with PyTorch $(tail -c 80 "$work/speed.txt")"
