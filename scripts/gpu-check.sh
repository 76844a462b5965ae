#!/usr/bin/env bash
# The GPU checks of the CUDA backend, in one command, on an NVIDIA GPU
# (H100/H200):
#   scripts/gpu-check.sh [OUT_DIR]
# 1. builds (CUDA for sm_90 unless CMAKE_CUDA_ARCHITECTURES is set) and runs
#    every test; the gpu-labelled parity suite must run here, not skip;
# 2. compute-sanitizer memcheck, racecheck, synccheck and initcheck on the
#    parity suite;
# 3. xfmr-charlm on tiny Shakespeare, same seed, CPU and CUDA: loss curves
#    side by side (per-step CSVs and the largest gap);
# 4. xfmr-bench and benchmark/pytorch_reference.py --device cuda, alternately:
#    shakespeare-small (CPU, CUDA with graph steps, CUDA queueing every
#    kernel, PyTorch) and GPT-2-small (vocabulary 50257), in float32 and in
#    bf16 (xfmr's --precision bf16 products, PyTorch's autocast); then the
#    GPT-2-small step's time and peak device memory per --recompute mode;
# 5. a random stories15m (llama2.c's layout, through load_pretrained):
#    the GPU's greedy tokens against the CPU's.
# Everything lands in OUT_DIR (default build/gpu-check). Every step runs even
# when an earlier one fails; the exit status says whether all passed.
#
# XFMR_BUILD uses programs built elsewhere, so that nothing is built on the
# GPU machine: scripts/gpu-pack.sh's archive (lease/xfmr-lease.tar.xz), or a
# folder laid out as a build tree with the libraries in lib/; then only the
# GPU tests run in step 1. scripts/gpu-lease.sh is the part of this that
# fits one 15-minute lease. XFMR_DATA=DIR is where tinyshakespeare.txt is
# (default: the archive's data/, else ../shared/data).
# XFMR_STEP_TIMEOUT=SECONDS bounds each step (default 900); XFMR_SANITIZERS
# names the compute-sanitizer tools to run (default all four);
# XFMR_BENCH_ROUNDS the alternating benchmark rounds (default 2).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
source scripts/gpu-env.sh
out=${1:-build/gpu-check}
mkdir -p "$out"
nvidia-smi -L || { echo "gpu-check: no NVIDIA GPU here" >&2; exit 1; }
if [[ -z ${XFMR_BUILD:-} ]]; then
  cmake --preset release ${CMAKE_CUDA_ARCHITECTURES:+-DCMAKE_CUDA_ARCHITECTURES=$CMAKE_CUDA_ARCHITECTURES} \
    > "$out/configure.log" || exit 1
  cmake --build --preset release -j"$(nproc)" > "$out/build.log" || { tail -30 "$out/build.log"; exit 1; }
fi
gpu_programs "$out" || exit 1
if [[ -n ${XFMR_BUILD:-} ]]; then
  step "cuda runtime tests" "$xrun" "$bin/test/test_cuda_runtime"
else
  step "ctest" ctest --test-dir "$bin" -j"$(nproc)" --output-on-failure
fi

# 1. The parity suites, verbosely (they skip with 77 only when no GPU is
#    found): float32 activations, and bfloat16 ones (CudaBf16Backend).
for suite in test_cuda_parity test_cuda_bf16; do
  step "$suite" bash -c "'$xrun' '$bin/test/$suite' --report_level=short > '$out/$suite.log' 2>&1; \
    rc=\$?; grep -E 'error|failure|passed|skipped' '$out/$suite.log' | tail -40; exit \$rc"
done

# 2. compute-sanitizer on the parity suites: memory errors (out-of-bounds,
#    misaligned), shared-memory races, barrier misuse, reads of memory
#    nothing wrote.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in ${XFMR_SANITIZERS-memcheck racecheck synccheck initcheck}; do
  for suite in test_cuda_parity test_cuda_bf16; do
    step "$tool $suite" bash -c "'$xrun' '$sanitizer' --tool $tool --error-exitcode 3 '$bin/test/$suite' \
      > '$out/${tool}_$suite.log' 2>&1; rc=\$?; tail -3 '$out/${tool}_$suite.log'; exit \$rc"
  done
done

# 3. The same training on both backends.
data=${XFMR_DATA:-$([[ -d $bin/data ]] && echo "$bin/data" || echo ../shared/data)}/tinyshakespeare.txt
for be in cpu cuda; do
  step "charlm $be" bash -c "'$xrun' '$bin/examples/xfmr-charlm' train --data '$data' --model shakespeare-small \
    --steps 300 --eval-every 100 --eval-batches 20 --samples 200 --seed 1337 --backend $be \
    --log-csv '$out/charlm_$be.csv' --metrics-json '$out/charlm_$be.json' > '$out/charlm_$be.log' 2>&1; \
    rc=\$?; tail -4 '$out/charlm_$be.log'; exit \$rc"
done
step "loss curves" python3 - "$out" <<'PY'
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
sys.exit(0 if worst[0] < 0.05 else 1)
PY

# 4. Speed: xfmr and PyTorch eager on the same GPU, alternately, twice.
bench=("$xrun" "$bin/benchmark/xfmr-bench")
ref="python3 benchmark/pytorch_reference.py --device cuda"
gpt2=(--model gpt2-small --vocab 50257 --batch 8 --min-time 2)
for ((round = 1; round <= ${XFMR_BENCH_ROUNDS:-2}; ++round)); do
  for be in cpu cuda; do
    step "bench small $be $round" "${bench[@]}" --model shakespeare-small --backend $be \
      --json "$out/small_${be}_$round.json"
  done
  step "bench small cuda eager $round" "${bench[@]}" --model shakespeare-small --backend cuda --eager \
    --modes train,forward --json "$out/small_cuda_eager_$round.json"
  step "torch small cuda $round" $ref --model shakespeare-small --json "$out/small_torch_$round.json"
  step "bench gpt2 cuda $round" "${bench[@]}" "${gpt2[@]}" --backend cuda --modes train,forward \
    --json "$out/gpt2_cuda_$round.json"
  step "torch gpt2 cuda $round" $ref "${gpt2[@]}" --modes train,forward --json "$out/gpt2_torch_$round.json"
  step "bench gpt2 cuda bf16 $round" "${bench[@]}" "${gpt2[@]}" --backend cuda --precision bf16 --modes train,forward \
    --json "$out/gpt2_cuda_bf16_$round.json"
  step "torch gpt2 cuda bf16 $round" $ref "${gpt2[@]}" --precision bf16 --sdpa --modes train,forward \
    --json "$out/gpt2_torch_bf16_$round.json"
done
# Peak device memory of a GPT-2-small step per recompute mode (one process each),
# with the tiled attention kernels (T 1024: past the fused kernels' 256 keys).
for mode in none cheap block; do
  step "bench gpt2 cuda recompute $mode" "${bench[@]}" "${gpt2[@]}" --backend cuda --modes train --recompute "$mode" \
    --json "$out/gpt2_cuda_recompute_$mode.json"
  step "bench gpt2 cuda tiled recompute $mode" env XFMR_CUDA_FLASH_ATTENTION=1 "${bench[@]}" "${gpt2[@]}" \
    --backend cuda --modes train --recompute "$mode" --json "$out/gpt2_cuda_tiled_recompute_$mode.json"
done

# 5. A published model's shape (a random stories15m, llama2.c's layout,
#    through load_pretrained and the Llama family's library file) decodes
#    the CPU's greedy tokens on the GPU, in float32.
step "stories15m checkpoint" python3 benchmark/random_checkpoint.py stories15m "$out/stories15m.bin"
for be in cpu cuda; do
  step "bench stories15m $be" "${bench[@]}" --pretrained "$out/stories15m.bin" --backend "$be" --decode-tokens 128 \
    --min-time 1 --json "$out/stories15m_$be.json"
done
step "stories15m greedy cpu = cuda" python3 - "$out" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/stories15m_{be}.json"))["greedy"] for be in ("cpu", "cuda"))
same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
print(f"the first {same} of {len(a)} greedy tokens agree")
sys.exit(0 if same >= 32 else 1)
PY

if ((${#failed[@]})); then
  printf 'gpu-check: FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "gpu-check: all passed; results in $out"
