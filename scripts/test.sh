#!/usr/bin/env bash
# Installs the dependencies, builds xfmr (release preset) and runs every test.
# Usage: scripts/test.sh [preset]     (release | debug | asan; default release)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-release}"

scripts/install-deps.sh
cmake --preset "$preset"
cmake --build --preset "$preset" --parallel "$(nproc)"
ctest --preset "$preset" --parallel "$(nproc)"
