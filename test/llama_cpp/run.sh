#!/usr/bin/env bash
# llama.cpp and xfmr on the same GGUF files (ctest llama_cpp_agreement):
#   run.sh XFMR_LM PYTHON PYTHON_MODULE_DIR WORK_DIR
# Installs the locked node-llama-cpp (llama.cpp's prebuilt CPU library) in
# WORK_DIR with npm ci, then runs agreement.py. Exit 77 (skipped) without
# Node and npm, or when npm ci fails and the registry does not answer; when
# it answers, a failed install fails the test.
set -euo pipefail
lm=$1 python=$2 module=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
command -v node > /dev/null && command -v npm > /dev/null || { echo "no node/npm: skipped"; exit 77; }
mkdir -p "$work"
cp "$here/package.json" "$here/package-lock.json" "$here/greedy.mjs" "$work/"
cd "$work"
if ! cmp -s package-lock.json node_modules/.xfmr-lock 2> /dev/null; then  # installed already: kept
  if ! NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm ci --omit=optional --ignore-scripts --no-audit --no-fund > npm.log 2>&1; then
    cat npm.log
    npm ping > /dev/null 2>&1 && { echo "npm ci failed with the registry answering"; exit 1; }
    echo "npm ci failed and the npm registry does not answer: skipped"
    exit 77
  fi
  cp package-lock.json node_modules/.xfmr-lock
fi
PYTHONPATH=$module${PYTHONPATH:+:$PYTHONPATH} "$python" "$here/agreement.py" "$lm" "$work"
