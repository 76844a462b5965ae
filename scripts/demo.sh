#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: installs what is needed (with
# Debian's fortune-cookie collection as the default corpus), builds
# xfmr-charlm, trains the shakespeare-small character GPT for a few minutes
# and prints samples.
#   scripts/demo.sh [STEPS]      (default 4000; a step is ~15 ms on 2 cores)
# Everything it writes goes under build/demo/ (a rerun replaces it: --overwrite).
set -euo pipefail
cd "$(dirname "$0")/.."
steps="${1:-4000}"

scripts/install-deps.sh fortunes
cmake --preset release
cmake --build --preset release --target xfmr-charlm --parallel "$(nproc)"

demo=build/demo
mkdir -p "$demo"
# The default corpus: every fortune file Debian installs (the .dat indexes and
# .u8 links skipped), one stream of text.
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' | sort | xargs cat > "$demo/fortunes.txt"
echo "corpus: $(wc -c < "$demo/fortunes.txt") bytes of fortune cookies"

charlm=build/release/examples/xfmr-charlm
"$charlm" train --data "$demo/fortunes.txt" --model shakespeare-small --steps "$steps" --batch 16 --lr 1e-3 \
  --eval-every 1000 --eval-batches 50 --samples 400 --out "$demo/checkpoint" --overwrite \
  --log-csv "$demo/log.csv" --report "$demo/report.html" --metrics-json "$demo/metrics.json"

# Training printed a sample at temperature 1 (it is in the report too); one
# more from the saved checkpoint, cooler and with a prompt:
echo
echo "=== sample from the checkpoint (temperature 0.8) ==="
"$charlm" sample --checkpoint "$demo/checkpoint" --tokens 300 --temperature 0.8 --seed 2 --prompt "The computer"
echo
echo "report: $demo/report.html   log: $demo/log.csv   checkpoint: $demo/checkpoint"
echo "more:   $charlm sample --checkpoint $demo/checkpoint --prompt 'Your TEXT' --top-k 10"
