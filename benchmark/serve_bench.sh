#!/usr/bin/env bash
# xfmr-serve's throughput and latency on one model and precision:
#   benchmark/serve_bench.sh BUILD_DIR MODEL TOKENIZER PRECISION [xfmr-serve-bench options...]
# Starts xfmr-serve (16 slots, so that every client of the largest round
# decodes at once; context 512) on a free port, runs xfmr-serve-bench
# (default rounds: 1, 4, 8 and 16 clients), and stops the server.
# BENCHMARKS.md ("Serving") has the numbers and the commands that made them.
set -euo pipefail
build=$1 model=$2 tokenizer=$3 precision=$4
shift 4
cmake --build "$build" --target xfmr-serve-bench > /dev/null  # built on demand (no test runs it)
log=$(mktemp)
"$build/server/xfmr-serve" --model "$model" --tokenizer "$tokenizer" --precision "$precision" --port 0 \
  --slots 16 --context 512 2> "$log" &
pid=$!
trap 'kill $pid 2> /dev/null || true; rm -f "$log"' EXIT
port=""
for _ in $(seq 1200); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$log")
  [[ -n $port ]] && curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  kill -0 $pid 2> /dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
grep "slots of" "$log"
"$build/benchmark/xfmr-serve-bench" --url "http://127.0.0.1:$port" "$@"
