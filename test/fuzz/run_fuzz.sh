#!/usr/bin/env bash
# Runs one libFuzzer target from its seed corpus in a scratch directory:
#   run_fuzz.sh TARGET_BINARY SEED_DIR WORK_DIR [libFuzzer options...]
# CTest's smoke runs pass -max_total_time=N; a longer run passes -runs=N.
# The scratch directory holds small inputs the command-line targets may name
# (corpus.txt, a.tsv, a.src, ...), and the corpus the run grows (the seeds
# are only read). Exit status: libFuzzer's (0 when nothing was found).
set -euo pipefail
fuzzer=$(realpath "$1") seeds=$(realpath "$2") work=$3
shift 3
rm -rf "$work" && mkdir -p "$work/grown" && cd "$work"
# The files a target writes for each input (fuzz_charlm_state's checkpoints,
# fsynced; fuzz_llama2c's .bin) go to memory where the machine has a
# writable /dev/shm: three times the executions of a disk's /tmp.
if [[ -z ${TMPDIR:-} && -d /dev/shm && -w /dev/shm ]]; then export TMPDIR=/dev/shm; fi
printf 'the cat sat on the mat.\na dog ran to the park.\n' > corpus.txt
printf 'label\tsentence\n1\ta fine film\n0\tdull\n' > a.tsv && cp a.tsv b.tsv
printf 'red cat.\nblue dog.\n' > a.src && printf 'chat rouge.\nchien bleu.\n' > a.tgt
cp a.src v.src && cp a.tgt v.tgt
exec "$fuzzer" -seed=1 -close_fd_mask=3 -max_len=4096 -timeout=20 -rss_limit_mb=4096 "$@" grown "$seeds"
