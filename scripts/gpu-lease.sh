#!/usr/bin/env bash
# What one lent GPU machine runs, from programs built here (nothing is
# built there):
#   here:    scripts/gpu-pack.sh                    (lease/xfmr-lease.tar.xz)
#   there:   XFMR_BUILD=lease/xfmr-lease.tar.xz scripts/gpu-lease.sh "$OUT"
#            (the device call carries lease/; docs/GUIDE.md, "On a GPU")
# Within XFMR_LEASE_SECONDS (default 570), each step under its own limit:
# 1. test_cuda_parity whole, then compute-sanitizer memcheck on the cases
#    that have not run on a GPU yet (NEW below); test_cuda_bf16 (bf16
#    storage: CudaBf16Backend) whole, and its operations under memcheck;
# 2. shakespeare-large, the seeds' recipe (Karpathy's lecture: B64 T256,
#    AdamW 3e-4 constant, dropout 0.2, 5000 steps, 200 validation batches
#    every 500; target val loss 1.48), on CUDA with bf16 products when
#    their two parity cases passed in step 1, else TF32;
# 3. the GPT-2-small training step (vocabulary 50257, B16 T1024, issue
#    44's size, which every path fits in 80 GB: about 28 GB materialised,
#    FP32): xfmr in
#    float32, TF32 and bf16 products, each with the materialised and the
#    tiled attention kernels (XFMR_CUDA_FLASH_ATTENTION=1), bf16 in the
#    fast path (tiled, the fused loss, XFMR_CUDA_FUSED_LOSS=1, and
#    cuBLASLt's epilogues, XFMR_CUDA_LT_EPILOGUES=1), bf16 storage
#    (--backend cuda-bf16) in the fast path, and PyTorch
#    (autocast bf16 and TF32, both through scaled_dot_product_attention),
#    alternating, XFMR_BENCH_ROUNDS rounds (default 1): ms a step, tokens/s,
#    peak device memory;
#    Then attention alone at the same size, forward and backward: xfmr's
#    tiled kernels in FP32 and bf16 (tensor cores) against PyTorch's SDPA;
#    and GPT-2-small's loss over 300 steps (B16 T256, tiny Shakespeare in
#    GPT-2's tokens, no dropout) in strict FP32 and in bf16 storage in the
#    fast path (cuda-bf16, tiled attention, fused loss, cuBLASLt
#    epilogues): within 1% of each other;
# 4. a random stories15m (llama2.c's layout) decoded greedily on the CPU and
#    on CUDA: the first 32 tokens must agree; then Nsight Compute's time of
#    each kernel of one fast-path GPT-2-small step (where ncu is);
# 5. with the time left, racecheck, synccheck and initcheck on NEW.
# Step 3 runs before step 2: issue 44's numbers first, then the large model
# in what time is left.
# The table is printed last and saved as OUT/summary.txt; every log is in
# OUT/logs.tar.gz, the large model's log, CSV and metrics beside them.
# XFMR_LEASE_DRY=1 runs every step on the CPU at toy sizes, on a machine
# without a GPU (the parity suite then skips): a check of the package, the
# commands and the table before the lease.
#
# Estimates on an H100, from FLOP counts (pytorch_reference.py's) and the
# rates the 2026-11-25 lease measured (GPT-2-small's step at 34 TFLOP/s in
# FP32, 87 in TF32):
#   1. parity: the CPU references dominate, about 1 minute; memcheck on NEW
#      about 2 minutes (memcheck slows kernels 10-50x). Limits 120 s each.
#   2. shakespeare-large: 1.16 TFLOP a step; at 50 TFLOP/s (TF32 or bf16 at
#      this model's smaller products) 23 ms, 5000 steps in 116 s, plus ten
#      evaluations of 200 forwards (~15 s): about 2.2 minutes (FP32 would be
#      about 4). Its limit is 240 s: a timeout keeps the last evaluation's
#      checkpoint and the CSV says how far it got.
#   3. 14 TFLOP a step (the 50257-wide head is a quarter): FP32 ~410 ms,
#      TF32 ~160 ms, bf16 ~140 ms; nine processes a round of 6-12 s each.
#      Attention alone: about 10 s a process.
#      The loss curves: 3.1 TFLOP a step, FP32 ~30 s, bf16 ~15 s, plus
#      start-up and tokenising, about 1 minute.
#   4. about 20 s; the profile (one step, each of its ~600 kernels timed
#      alone) ~30 s.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
source scripts/gpu-env.sh
out=${1:-build/gpu-lease}
mkdir -p "$out"
work=$(mktemp -d)
deadline=$((SECONDS + ${XFMR_LEASE_SECONDS:-570}))
py=${PYTHON:-python3}
if [[ ${XFMR_LEASE_DRY:-0} == 1 ]]; then
  echo "dry run on the CPU" > "$work/gpu.txt"
  cuda() { echo cpu; }
  step_skips=1 device=cpu sdpa='' large=(4 4 2 2) gpt2_size=(--batch 1 --seq-len 32) attention_size=(64 1)
  curve_size=(--steps 4 --batch 1 --context 32 --eval-every 2 --eval-windows 2)
  timing=(--min-time 0 --min-reps 1 --warmup 0)
else
  nvidia-smi -L || { echo "gpu-lease: no NVIDIA GPU here" >&2; exit 1; }
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv > "$work/gpu.txt"
  cuda() { echo "$1"; }
  device=cuda sdpa=--sdpa large=(5000 64 500 200) gpt2_size=(--batch 16) attention_size=(1024 8)
  curve_size=(--steps 300 --batch 16 --context 256 --eval-every 100 --eval-windows 32)
  timing=(--min-time 1 --min-reps 5 --warmup 2)
fi
gpu_programs "$work" || exit 1
# The fast path: the CUDA options off by default until they have run on a GPU.
fast_path=(XFMR_CUDA_FLASH_ATTENTION=1 XFMR_CUDA_FUSED_LOSS=1 XFMR_CUDA_LT_EPILOGUES=1)
within() {  # within SECONDS: the next step's limit, never past the deadline
  local left=$((deadline - SECONDS))
  step_limit=$(($1 < left ? $1 : left))
  ((step_limit > 0)) || step_limit=1
}

# The parity cases written since the last GPU run (2026-11-25 at d870a34):
# GeGLU (activations), the attention planner, the tiled kernels, NCCL, the
# device-memory count, bf16 products, the fused loss, cuBLASLt's epilogues,
# the tensor cores'
# tiled attention, recompute, graph steps
# under it, and the workspace's no-allocation step.
new="operations/activations,attention_forward_backward,tiled_attention_matches_the_cpu"
new+=",nccl_sum_over_one_rank_is_the_identity,device_memory_is_counted,bf16_gemm_within_its_bound"
new+=",fused_cross_entropy_matches_the_cpu,bf16_tiled_attention_on_tensor_cores,lt_epilogues_match_the_cpu"
new+=":layers_blocks_models/recompute_and_tiled_attention_on_the_gpu,decoder_in_bf16_products,decoder_with_lt_epilogues"
new+=",steps_allocate_no_device_memory_after_the_first,graph_steps_train_bit_for_bit_like_eager"
parity=$bin/test/test_cuda_parity
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
sanitize() {  # sanitize TOOL SECONDS [TEST CASES]: compute-sanitizer TOOL on TEST's CASES (default: parity's NEW)
  local test=${3:-$parity} cases=${4-$new} label="$1 (new cases)" log=$work/$1.log
  if [[ -n ${3:-} ]]; then label="$1 ($(basename "$3"))" log=$work/$1_$(basename "$3").log; fi
  if [[ ! -x $sanitizer && ${step_skips:-0} == 1 ]]; then echo "gpu-lease: no compute-sanitizer here: $1 skipped"; return; fi
  within "$2"
  step "$label" bash -c "'$xrun' '$sanitizer' --tool $1 --error-exitcode 3 '$test' ${cases:+--run_test='$cases'} \
    --color_output=no > '$log' 2>&1; rc=\$?; grep -E 'ERROR SUMMARY|not supported' '$log' | tail -2; exit \$rc"
}

# 1. The parity suite whole, then memcheck on what is new.
within 120
step "parity (whole suite)" bash -c "'$xrun' '$parity' --color_output=no --log_level=test_suite --report_level=short \
  > '$work/parity.log' 2>&1; rc=\$?; grep -E 'error|passed|failed|skipped' '$work/parity.log' | tail -8; exit \$rc"
sanitize memcheck 120
within 60  # bf16 storage
step "bf16 storage (test_cuda_bf16)" bash -c "'$xrun' '$bin/test/test_cuda_bf16' --color_output=no \
  --log_level=test_suite --report_level=short > '$work/bf16.log' 2>&1; rc=\$?; grep -E 'error|passed|failed' \
  '$work/bf16.log' | tail -8; exit \$rc"
sanitize memcheck 90 "$bin/test/test_cuda_bf16" operations  # every operation (the model's steps: too slow)

data=${XFMR_DATA:-$bin/data}/tinyshakespeare.txt  # steps 2 and 3c

# 3. GPT-2-small's step: xfmr's eight ways and PyTorch's two, alternating.
gpt2=(--model gpt2-small --vocab 50257 "${gpt2_size[@]}" --modes train "${timing[@]}")
for ((round = 1; round <= ${XFMR_BENCH_ROUNDS:-1}; ++round)); do
  for attention in materialised tiled; do
    flash=$([[ $attention == tiled ]] && echo 1 || echo 0)
    for precision in fp32 tf32 bf16; do
      case $precision in
        fp32) how=(--backend "$(cuda cuda)") ;;
        tf32) how=(--backend "$(cuda cuda-tf32)") ;;
        bf16) how=(--backend "$(cuda cuda)" --precision bf16) ;;
      esac
      within 60
      name=gpt2_xfmr_${precision}_${attention}_$round
      step_log=$work/$name.log step "gpt2 xfmr $precision $attention $round" env XFMR_CUDA_FLASH_ATTENTION=$flash \
        "$xrun" "$bin/benchmark/xfmr-bench" "${gpt2[@]}" "${how[@]}" --json "$work/$name.json"
    done
  done
  within 60  # the fast path: what is off by default until it has run on a GPU
  name=gpt2_xfmr_bf16_fast-path_$round
  step_log=$work/$name.log step "gpt2 xfmr bf16 fast path $round" env "${fast_path[@]}" \
    "$xrun" "$bin/benchmark/xfmr-bench" "${gpt2[@]}" --backend "$(cuda cuda)" --precision bf16 \
    --json "$work/$name.json"
  within 60  # bf16 storage (CudaBf16Backend), in the fast path
  name=gpt2_xfmr_bf16-storage_fast-path_$round
  step_log=$work/$name.log step "gpt2 xfmr bf16 storage $round" env "${fast_path[@]}" \
    "$xrun" "$bin/benchmark/xfmr-bench" "${gpt2[@]}" --backend "$(cuda cuda-bf16)" --precision bf16 \
    --json "$work/$name.json"
  for precision in bf16 tf32; do
    if [[ $precision == bf16 ]]; then how=(--precision bf16); else how=(--tf32); fi
    within 60
    name=gpt2_torch_${precision}_$round
    step_log=$work/$name.log step "gpt2 torch $precision sdpa $round" $py benchmark/pytorch_reference.py --device $device \
      "${gpt2[@]}" "${how[@]}" $sdpa --json "$work/$name.json"
  done
done

# 3b. Attention alone (GPT-2's 12 heads of 64, causal, B8 T1024), forward and
#     backward: xfmr's tiled kernels in float32 (CUDA cores) and bf16 (tensor
#     cores), each beside the materialised path, and PyTorch's SDPA in bf16.
for precision in fp32 bf16; do
  within 60
  step_log=$work/attention_xfmr_$precision.log step "attention xfmr $precision" "$xrun" "$bin/benchmark/xfmr-bench" \
    --attention "${attention_size[0]}" --batch "${attention_size[1]}" --backend "$(cuda cuda)" --precision $precision \
    "${timing[@]}" --json "$work/attention_xfmr_$precision.json"
done
if [[ -n $sdpa ]]; then
  within 60
  step_log=$work/attention_torch_bf16.log step "attention torch bf16 sdpa" $py benchmark/pytorch_reference.py \
    --device $device --attention "${attention_size[0]}" --batch "${attention_size[1]}" --precision bf16 \
    "${timing[@]}" --json "$work/attention_torch_bf16.json"
fi

# 3c. GPT-2-small's loss in bf16 storage against strict float32: the same
#     seed, no dropout, 300 steps of B16 T256 on tiny Shakespeare (GPT-2's
#     tokenizer); cuda-bf16 in the fast path must stay within 1% of FP32's
#     (its evaluations, and its last 50 batches' mean).
curve=(--preset gpt2-small --tokenizer "${XFMR_DATA:-$bin/data}/gpt2" --data "$data" --dropout 0 "${curve_size[@]}")
for precision in fp32 bf16; do
  if [[ $precision == bf16 ]]; then
    how=(--backend "$(cuda cuda-bf16)" --precision bf16) fast=("${fast_path[@]}")
  else how=(--backend "$(cuda cuda)") fast=(); fi
  within 90
  step_log=$work/curve_$precision.log step "gpt2 loss curve $precision" env "${fast[@]}" \
    "$xrun" "$bin/examples/xfmr-lm" train "${curve[@]}" "${how[@]}" \
    --log-csv "$work/curve_$precision.csv" --report "$work/curve_$precision.html" \
    --metrics-json "$work/curve_$precision.json"
done
within 10
step_log=$work/curve.log step "gpt2 loss curve bf16 within 1% of fp32" $py - "$work" <<'PY'
import csv, sys
def curve(name):
    rows = list(csv.DictReader(open(f"{sys.argv[1]}/curve_{name}.csv")))
    evals = {int(r["step"]): float(r["eval_val"]) for r in rows if r["eval_val"]}
    batches = [float(r["batch_loss"]) for r in rows if r["batch_loss"]]
    return evals, sum(batches[-50:]) / len(batches[-50:])
(ref, ref_tail), (fast, fast_tail) = curve("fp32"), curve("bf16")
pairs = [(f"val@{s}", ref[s], fast[s]) for s in sorted(ref) if s in fast] + [("last 50", ref_tail, fast_tail)]
worst = max(abs(b - a) / a for _, a, b in pairs)
print("; ".join(f"{n} {a:.4f}/{b:.4f}" for n, a, b in pairs) + f"; worst {100 * worst:.2f}%")
sys.exit(0 if worst <= 0.01 and len(pairs) > 1 else 1)
PY

# 2. The seeds' large model (after step 3: the time left, at most 240 s), in
#    bf16 products only where they passed.
bf16_ok() {
  grep -q 'Leaving test case "bf16_gemm_within_its_bound"' "$work/parity.log" &&
    grep -q 'Leaving test case "decoder_in_bf16_products"' "$work/parity.log" &&
    ! grep -qE 'in "(operations/bf16_gemm_within_its_bound|layers_blocks_models/decoder_in_bf16_products)"' \
      "$work/parity.log"
}
if bf16_ok; then how=(--backend "$(cuda cuda)" --precision bf16) large_name=bf16
else how=(--backend "$(cuda cuda-tf32)") large_name=tf32; fi
within 240
step "shakespeare-large ${large[0]} steps ($large_name)" bash -c "'$xrun' '$bin/examples/xfmr-charlm' train \
  --data '$data' --model shakespeare-large --steps ${large[0]} --batch ${large[1]} --lr 3e-4 --eval-every ${large[2]} \
  --eval-batches ${large[3]} --samples 500 ${how[*]} --out '$work/large' --log-csv '$work/large.csv' --report '$work/large.html' \
  --metrics-json '$work/large.json' > '$work/large.log' 2>&1; rc=\$?; tail -3 '$work/large.log'; exit \$rc"

# 4. A published model's shape through load_pretrained, on both backends.
within 90
step "stories15m greedy cpu = cuda" bash -c "$py benchmark/random_checkpoint.py stories15m '$work/stories15m.bin' &&
  for be in cpu $(cuda cuda); do '$xrun' '$bin/benchmark/xfmr-bench' --pretrained '$work/stories15m.bin' --backend \$be \
    --decode-tokens 128 --min-time 1 --json '$work/stories15m_'\$be.json > '$work/stories15m_'\$be.log 2>&1 || exit; done &&
  $py - '$work' $(cuda cuda) <<'PY'
import json, sys
a, b = (json.load(open(f'{sys.argv[1]}/stories15m_{be}.json'))['greedy'] for be in ('cpu', sys.argv[2]))
same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
print(f'the first {same} of {len(a)} greedy tokens agree')
sys.exit(0 if same >= 32 else 1)
PY"

# 4b. Where the fast path's step goes: Nsight Compute's duration of each
#     kernel of one eager GPT-2-small step (bf16 in the fast path; --smoke:
#     one step, after the bench's one 128 x 128 product), summed by kernel
#     in the table.
ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)
if [[ -z $ncu || ${XFMR_LEASE_DRY:-0} == 1 ]]; then
  echo "gpu-lease: no ncu here (or a dry run): the profile skipped"
elif ((deadline - SECONDS >= 60)); then
  within 60
  step_log=$work/profile.log step "profile gpt2 bf16 step (ncu)" env "${fast_path[@]}" \
    "$ncu" --clock-control none --metrics gpu__time_duration.sum --print-kernel-base function --csv \
    --log-file "$work/profile.csv" "$xrun" "$bin/benchmark/xfmr-bench" --model gpt2-small --vocab 50257 --batch 16 \
    --modes train --eager --backend cuda --precision bf16 --smoke
else
  echo "gpu-lease: the profile skipped: no time left"
fi

# 5. The other sanitizers, while time is left.
for tool in racecheck synccheck initcheck; do
  if ((deadline - SECONDS >= 60)); then sanitize "$tool" 120; else echo "gpu-lease: $tool skipped: no time left"; fi
done

# The table: each step, then the numbers that matter.
{
  echo "xfmr lease: $(cat "$bin/COMMIT" 2>/dev/null | paste -sd' ') on $(tail -1 "$work/gpu.txt")"
  step_table
  $py - "$work" <<'PY'
import csv, glob, json, os, re, sys
work = sys.argv[1]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None
log = open(f"{work}/parity.log", errors="replace").read() if os.path.exists(f"{work}/parity.log") else ""
m = re.search(r"(\d+) test cases? out of (\d+) passed", log)
print(f"parity: {m.group(1)} of {m.group(2)} cases passed" if m else "parity: no report")
log = open(f"{work}/bf16.log", errors="replace").read() if os.path.exists(f"{work}/bf16.log") else ""
m = re.search(r"(\d+) test cases? out of (\d+) passed", log)
print(f"bf16 storage: {m.group(1)} of {m.group(2)} cases passed" if m else "bf16 storage: no report")
large = load(f"{work}/large.json")
if large:
    print(f"shakespeare-large: val loss {large['val_loss']:.4f} (train {large['train_loss']:.4f}; target 1.48), "
          f"{large['wall_s']:.0f} s, {large['tokens_per_s']:.0f} tokens/s")
elif os.path.exists(f"{work}/large.csv"):
    rows = [r for r in csv.DictReader(open(f"{work}/large.csv")) if r.get("val_loss")]
    print(f"shakespeare-large: unfinished; last val loss {rows[-1]['val_loss']} at step {rows[-1]['step']}"
          if rows else "shakespeare-large: unfinished, no evaluation")
# MFU as llm.c counts it: xfmr's runs carry it; PyTorch's take the FLOPs a
# token and the peak of xfmr's run in the same precision.
rows, per_token_over_peak = [], {}
for name in sorted({re.sub(r"_\d+\.json$", "", os.path.basename(p)) for p in glob.glob(f"{work}/gpt2_*.json")}):
    runs = [j for j in (load(p) for p in sorted(glob.glob(f"{work}/{name}_[0-9]*.json"))) if j]
    steps = [j["results"]["train_step"] for j in runs]
    if steps:
        precision = next((p for p in ("bf16", "tf32", "fp32") if p in name), "fp32")
        best = max(steps, key=lambda r: r["tokens_per_s"])
        if "mfu" in best:
            per_token_over_peak[precision] = best["mfu"] / best["tokens_per_s"]
        rows.append((name, precision, runs, steps, best))
shape = rows[0][2][0]["shape"] if rows else {"B": "?", "T": "?", "V": "?"}
print(f"{'GPT-2-small step, B%s T%s V%s' % (shape['B'], shape['T'], shape['V']):<37} ms a step (per round)   tokens/s"
      "   MFU   peak device MB (counted)")
for name, precision, runs, steps, best in rows:
    mfu = best.get("mfu", best["tokens_per_s"] * per_token_over_peak.get(precision, float("nan")))
    peak = max(j["memory"].get("peak_device_mb", 0) for j in runs)
    counted = runs[0]["memory"].get("analytical", {}).get("total_mb", 0)
    path = runs[0]["memory"].get("attention", "")
    ms = " / ".join("%.1f" % r["median_ms"] for r in steps)
    print(f"  {name[5:]:<36} {ms:<23} {best['tokens_per_s']:>8.0f} {100 * mfu:>5.1f}%  {peak:>8.0f} ({counted:.0f}) "
          f"{path}")
PY
  $py - "$work" <<'PY'
import glob, json, os, sys
rows = []
for path in sorted(glob.glob(f"{sys.argv[1]}/attention_*.json")):
    j = json.load(open(path))
    for name, r in j["results"].items():
        rows.append(f"  {os.path.basename(path)[10:-5] + ' ' + name:<36} {r['median_ms']:>10.2f} ms {r['tflops']:>8.1f}")
if rows:
    a = j["attention"]
    print(f"attention alone, B{a['B']} H{a['H']} T{a['T']} head {a['head']} causal, fwd+bwd     ms   TFLOP/s")
    print("\n".join(rows))
PY
  [[ -f $work/curve.log ]] && echo "GPT-2-small loss, FP32 / bf16 storage: $(tail -1 "$work/curve.log")"
  $py - "$work" <<'PY'
import collections, csv, os, sys
path = f"{sys.argv[1]}/profile.csv"
if os.path.exists(path):
    lines = [l for l in open(path, errors="replace") if l.startswith('"')]
    scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}
    ms, count = collections.Counter(), collections.Counter()
    for r in csv.DictReader(lines):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            name = r["Kernel Name"].split("(")[0][:56]
            ms[name] += float(r["Metric Value"].replace(",", "")) * scale.get(r["Metric Unit"], 1e-6)
            count[name] += 1
    total = sum(ms.values())
    print(f"one eager GPT-2-small bf16 step on the GPU: {total:.1f} ms in {sum(count.values())} kernels (ncu)")
    for name, t in ms.most_common(14):
        print(f"  {name:<56} {count[name]:>4} x {t:>8.2f} ms {100 * t / max(total, 1e-9):5.1f}%")
PY
  ((${#failed[@]})) && printf 'FAILED: %s\n' "${failed[@]}" || echo "all steps passed"
} > "$work/summary.txt"
cp "$work/summary.txt" "$work"/large.{json,csv,log} "$out/" 2>/dev/null
tar -C "$work" --exclude=large --exclude='*.bin' -czf "$out/logs.tar.gz" .
cat "$work/summary.txt"
((${#failed[@]} == 0))
