# shellcheck shell=bash
# Sourced by scripts/gpu-check.sh and scripts/gpu-lease.sh on a GPU machine:
#   gpu_programs           sets bin (programs in the build tree's layout),
#                          unpacking XFMR_BUILD first when it is
#                          gpu-pack.sh's archive, and writes $xrun, which
#                          runs one of them with its shipped libraries and
#                          the machine's cuBLAS and NCCL
#   step NAME COMMAND...   runs a step within step_limit seconds, goes on
#                          after a failure (failed names the ones that did)
#   step_table             the steps, their exit status and seconds
# Python (PyTorch) runs without the shipped libraries: only $xrun sees them.

gpu_programs() {  # gpu_programs OUT_DIR
  local out=$1
  if [[ -z ${XFMR_BUILD:-} ]]; then
    bin=build/release
  elif [[ $XFMR_BUILD == *.tar.xz ]]; then
    local dir=${TMPDIR:-/tmp}/xfmr-lease-$$
    mkdir -p "$dir" || return 1
    # (Python's tarfile reads xz where tar finds no xz program.)
    tar -xJf "$XFMR_BUILD" -C "$dir" 2> /dev/null || python3 -m tarfile -e "$XFMR_BUILD" "$dir" ||
      { echo "gpu: cannot unpack $XFMR_BUILD" >&2; return 1; }
    bin=$dir/xfmr-lease
  else
    bin=$XFMR_BUILD
  fi
  # CUDA's libraries are not shipped (gpu-pack.sh): the loader's own, else
  # the toolkit's folders, else PyTorch's wheels (nvidia/*/lib).
  local libs=$bin/lib name found places=(/usr/local/cuda*/lib* /usr/local/cuda*/targets/*/lib)
  local site
  for site in $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    places+=("$site/nvidia")
  done
  for name in libcublasLt.so.13 libcublas.so.13 libnccl.so.2; do
    ldconfig -p 2>/dev/null | awk '{print $1}' | grep -qxF "$name" && continue
    found=$(find "${places[@]}" -name "$name" 2>/dev/null | head -1)
    [[ -n $found ]] && libs+=:$(dirname "$found")
  done
  xrun=$out/xrun
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$@"\n' "$libs" > "$xrun"
  chmod +x "$xrun"
  local missing
  missing=$(for p in "$bin"/test/test_cuda_parity "$bin"/benchmark/xfmr-bench; do "$xrun" ldd "$p"; done |
              awk '/not found/ {print $1}' | sort -u | paste -sd' ')
  [[ -z $missing ]] || { echo "gpu: libraries not found: $missing (searched $libs)" >&2; return 1; }
  echo "gpu: programs in $bin ($(cat "$bin/COMMIT" 2>/dev/null | paste -sd' ' || echo 'this tree')), libraries $libs"
}

failed=()
steps=()
step_limit=${XFMR_STEP_TIMEOUT:-900}
# step NAME COMMAND...: run within step_limit seconds, remember a failure, go
# on. With step_log=FILE before it, the command's output goes to FILE and
# only its last line is shown.
step() {
  local name=$1; shift
  echo "== $name"
  local t0=$SECONDS rc
  if [[ -n ${step_log:-} ]]; then
    timeout "$step_limit" "$@" > "$step_log" 2>&1
    rc=$?
    tail -1 "$step_log"
  else
    timeout "$step_limit" "$@"
    rc=$?
  fi
  # A dry run on a machine without a GPU lets the GPU programs skip (77).
  ((rc == 77 && ${step_skips:-0})) && rc=0
  echo "-- $name: exit $rc in $((SECONDS - t0)) s"
  if ((rc == 124)); then echo "gpu: $name TIMED OUT after $step_limit s"; fi
  ((rc == 0)) || { echo "gpu: $name FAILED (exit $rc)"; failed+=("$name"); }
  steps+=("$(printf '%-40s %-9s %5d s' "$name" "$( ((rc == 0)) && echo ok || { ((rc == 124)) && echo TIMEOUT || echo "FAIL $rc"; })" \
    $((SECONDS - t0)))")
  return $rc
}

step_table() {
  printf '%s\n' "${steps[@]}"
}
