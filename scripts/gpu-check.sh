#!/usr/bin/env bash
# What issue 5 leaves to run on an NVIDIA GPU (H100/H200), in one command:
#   scripts/gpu-check.sh [OUT_DIR]
# 1. builds (CUDA for sm_90 unless CMAKE_CUDA_ARCHITECTURES is set) and runs
#    every test, the gpu-labelled parity suite included (it is skipped, not
#    run, without a GPU: this script fails instead);
# 2. compute-sanitizer memcheck on the parity suite;
# 3. xfmr-charlm on tiny Shakespeare, same seed, CPU and CUDA: loss curves
#    side by side (per-step CSVs and the largest gap);
# 4. xfmr-bench shakespeare-small on CPU and CUDA, and the GPT-2-small
#    shaped training step on CUDA, with JSON results.
# Everything lands in OUT_DIR (default build/gpu-check).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/gpu-check}
mkdir -p "$out"
nvidia-smi -L || { echo "gpu-check: no NVIDIA GPU here" >&2; exit 1; }
cmake --preset release ${CMAKE_CUDA_ARCHITECTURES:+-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES} > "$out/configure.log"
cmake --build --preset release -j"$(nproc)" > "$out/build.log"
bin=build/release

# 1. Every test; the parity suite must run, not skip.
ctest --test-dir "$bin" -j"$(nproc)" --output-on-failure 2>&1 | tee "$out/ctest.log"
"$bin/test/test_cuda_parity" --report_level=detailed > "$out/parity.log" 2>&1 || { tail -50 "$out/parity.log"; exit 1; }

# 2. Memory errors in the kernels (out-of-bounds, misaligned, uninitialised).
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
"$sanitizer" --tool memcheck --error-exitcode 3 "$bin/test/test_cuda_parity" > "$out/memcheck.log" 2>&1 \
  || { tail -50 "$out/memcheck.log"; exit 1; }

# 3. The same training on both backends.
data=../shared/data/tinyshakespeare.txt
for be in cpu cuda; do
  "$bin/examples/xfmr-charlm" train --data "$data" --model shakespeare-small --steps 300 --eval-every 100 \
    --eval-batches 20 --samples 200 --seed 1337 --backend "$be" --log-csv "$out/charlm_$be.csv" \
    --report "$out/charlm_$be.html" --metrics-json "$out/charlm_$be.json" > "$out/charlm_$be.log" 2>&1
done
python3 - "$out" <<'PY'
import csv, sys
out = sys.argv[1]
def batches(be):
    with open(f"{out}/charlm_{be}.csv") as f:
        return {int(r["step"]): float(r["batch_loss"]) for r in csv.DictReader(f) if r["batch_loss"]}
cpu, gpu = batches("cpu"), batches("cuda")
gaps = [(abs(cpu[s] - gpu[s]), s) for s in cpu if s in gpu]
worst = max(gaps)
print(f"charlm loss curves: {len(gaps)} steps compared, largest |cpu - cuda| = {worst[0]:.4g} at step {worst[1]}")
print("final batch loss cpu", cpu[max(cpu)], "cuda", gpu[max(gpu)])
PY

# 4. Speed.
"$bin/benchmark/xfmr-bench" --model shakespeare-small --backend cpu --json "$out/bench_small_cpu.json" | tee "$out/bench.log"
"$bin/benchmark/xfmr-bench" --model shakespeare-small --backend cuda --json "$out/bench_small_cuda.json" | tee -a "$out/bench.log"
"$bin/benchmark/xfmr-bench" --model gpt2-small --backend cuda --modes train,forward --batch 8 \
  --json "$out/bench_gpt2_cuda.json" | tee -a "$out/bench.log"
echo "gpu-check: all done; results in $out"
