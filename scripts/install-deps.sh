#!/usr/bin/env bash
# Installs what xfmr needs to build and test on Debian 12 (bookworm), from
# Debian's own packages. Does nothing when everything is already installed.
# Usage: scripts/install-deps.sh [extra-package ...]
set -euo pipefail

packages=(
  g++ cmake ninja-build pkg-config
  libeigen3-dev                      # Eigen 3.4
  libopenblas-openmp-dev             # the CPU backend's GEMMs (OpenBLAS sharing xfmr's OpenMP threads)
  libboost-test-dev libboost-program-options-dev
  nlohmann-json3-dev zlib1g-dev
  libcpp-httplib-dev curl            # the HTTP client of xfmr-serve's tests and benchmark; curl for its tests
  libpcre2-dev                       # GPT-2's pre-tokenizer (regular expressions with Unicode properties)
  libopenmpi-dev openmpi-bin         # training across processes (mpirun; core/distributed.hpp)
  python3-dev pybind11-dev           # the Python module (python/)
  python3-numpy python3-pytest       # its arrays and its tests
  python3-torch                      # PyTorch 1.13: the checks against it (gpt2_small_pytorch, example_lm_export_pytorch) run, not skip
  "$@"
)
# libxsmm (the CPU backend's small GEMMs: JIT kernels, no packing) and
# oneDNN (bf16 matrix products on AVX512-BF16: --precision bf16) on x86-64.
if [[ $(dpkg --print-architecture) == amd64 ]]; then packages+=(libxsmm-dev libdnnl-dev); fi

# xfmr-serve's client tests (test/serve_clients): Chromium for the chat page,
# and Node.js with npm for the openai package and playwright-core, unless a
# Node.js of another origin is on PATH already.
packages+=(chromium)
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then packages+=(nodejs npm); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
