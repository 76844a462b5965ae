#!/usr/bin/env bash
# Packs what a lent GPU machine runs, built here, so that nothing is built
# there:
#   scripts/gpu-pack.sh [ARCHIVE]      (default lease/xfmr-lease.tar.xz)
# builds the lease preset (-DXFMR_NATIVE=OFF: no instruction the GPU
# machine's processor may lack; CUDA for sm_90) and writes one archive of
#   test/test_cuda_parity, test/test_cuda_bf16, test/test_cuda_runtime, examples/xfmr-charlm,
#   examples/xfmr-lm, benchmark/xfmr-bench   stripped, where a build tree
#          has them
#   lib/   the shared libraries they load, except the C library's and the
#          C++ runtime's (the machine's own, newer) and CUDA's (cuBLAS, NCCL:
#          the machine's toolkit and PyTorch's wheels have them; gpu-env.sh
#          finds them there)
#   data/  tinyshakespeare.txt, and gpt2/ (GPT-2's tokenizer)
#   COMMIT the commit it was built from, and whether the tree had changes
# compressed, since oneDNN and OpenBLAS alone are larger than the 64 MiB
# the device tool carries. lease/ is ignored by git: the device call names
# it in carry (docs/GUIDE.md, "On a GPU").
set -euo pipefail
cd "$(dirname "$0")/.."
archive=${1:-lease/xfmr-lease.tar.xz}
targets=(test/test_cuda_parity test/test_cuda_bf16 test/test_cuda_runtime examples/xfmr-charlm examples/xfmr-lm benchmark/xfmr-bench)

cmake --preset lease > /dev/null
cmake --build --preset lease --parallel "$(( $(nproc) + 1 ))" --target "${targets[@]##*/}"

stage=build/lease-pack/xfmr-lease
rm -rf "$stage"
mkdir -p "$stage"/{lib,data/gpt2}
for t in "${targets[@]}"; do
  mkdir -p "$stage/${t%/*}"
  strip -o "$stage/$t" "build/lease/$t"
done
# Every library the programs resolve here, less the ones the GPU machine
# must supply itself.
system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.'
ldd "${targets[@]/#/$stage/}" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    [[ $name =~ $system ]] || cp -L "$path" "$stage/lib/$name"
  done
data=${XFMR_DATA:-../shared/data}
cp "$data/tinyshakespeare.txt" "$stage/data/"
cp "$data"/gpt2/{encoder.json,vocab.bpe} "$stage/data/gpt2/"
{ git rev-parse HEAD; if git status --porcelain --untracked-files=no | grep -q .; then echo "with uncommitted changes"; fi; } \
  > "$stage/COMMIT"
mkdir -p "$(dirname "$archive")"
tar -C "$(dirname "$stage")" -cJf "$archive" xfmr-lease
size=$(stat -c %s "$archive")
echo "gpu-pack: $archive, $((size / 1048576)) MiB ($(ls "$stage/lib" | wc -l) libraries), from $(head -1 "$stage/COMMIT")"
# The device tool carries 64 MiB with the working tree (about 3 MiB).
((size < 56 * 1048576)) || { echo "gpu-pack: $archive is over 56 MiB: too large to carry" >&2; exit 1; }
