#!/usr/bin/env bash
# Installs the dependencies, builds xfmr and runs its tests.
# Usage: scripts/test.sh [what]
#   (none)          release, then sanitizer-lane: what CI runs (.ci/run)
#   release         every test of the release preset
#   sanitizer-lane  the sanitizer-lane preset (the asan preset's Clang 14,
#                   ASan + UBSan, building only the suites that build and run
#                   quickly under it, and the fuzz targets' smoke runs)
#   debug | asan    every test of that preset
set -euo pipefail
self=$(realpath "$0")
cd "$(dirname "$self")/.."
what="${1:-all}"
clang_packages=(clang-14 libclang-rt-14-dev libomp-14-dev)  # the asan preset's compiler, its sanitizers, libFuzzer and OpenMP

# One job more than the cores: a compiler or a test waiting on the disk or
# a linker leaves a core idle otherwise (no test depends on timing).
jobs=$(( $(nproc) + 1 ))
# The CUDA backend is compiled where its tests can run: on a machine whose
# GPU answers nvidia-smi (XFMR_TEST_CUDA=ON or OFF decides otherwise).
# Without one it would be a sixth of the release build and run nothing; the
# presets themselves build it wherever nvcc is found (a developer's
# `cmake --preset release`, scripts/gpu-pack.sh before a lease), so that a
# change that breaks it is seen before a GPU is lent.
if [[ -z "${XFMR_TEST_CUDA:-}" ]]; then
  XFMR_TEST_CUDA=OFF
  if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then XFMR_TEST_CUDA=ON; fi
fi
run_preset() {  # run_preset PRESET [build target]
  if [[ "$1" == release || "$1" == debug ]]; then
    cmake --preset "$1" -DXFMR_CUDA="$XFMR_TEST_CUDA"
  else
    cmake --preset "$1"
  fi
  cmake --build --preset "$1" --parallel "$jobs" ${2:+--target "$2"}
}
# ctest PRESET [args]: the tests, then why each one that skipped did (the
# line it printed: "skipped: ...", "...; skipped", a level "this CPU lacks
# it"), which ctest's summary does not say.
run_tests() {
  local preset=$1 status=0
  shift
  ctest --preset "$preset" --parallel "$jobs" "$@" || status=$?
  awk '/^[0-9]+\/[0-9]+ Test: / { name = $3 }
       /^Output:/ { out = 1; next }
       /^<end of output>/ { out = 0 }
       out && ($0 ~ /^skipped/ || $0 ~ /; skipped$/ || $0 ~ /this CPU lacks it/) { print "skipped " name ": " $0 }' \
    "build/$preset/Testing/Temporary/LastTest.log" 2> /dev/null || true
  return "$status"
}

case "$what" in
  all)
    scripts/install-deps.sh "${clang_packages[@]}"
    bash "$self" release
    bash "$self" sanitizer-lane
    ;;
  release | debug)
    scripts/install-deps.sh
    run_preset "$what"
    run_tests "$what"
    ;;
  asan)
    scripts/install-deps.sh "${clang_packages[@]}"
    run_preset asan
    run_tests asan
    ;;
  sanitizer-lane)
    scripts/install-deps.sh "${clang_packages[@]}"
    run_preset sanitizer-lane
    run_tests sanitizer-lane
    ;;
  *)
    echo "usage: scripts/test.sh [release|sanitizer-lane|debug|asan]" >&2
    exit 2
    ;;
esac
