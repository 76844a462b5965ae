#!/usr/bin/env bash
# End-to-end checks of the example programs, one case per ctest test:
#   run_examples.sh CASE BIN_DIR WORK_DIR
# Each case fails (non-zero) with a message saying what went wrong.
set -uo pipefail
case_name=$1 bin=$2 work=$3
charlm="$bin/xfmr-charlm" classify="$bin/xfmr-classify" translate="$bin/xfmr-translate" lm="$bin/xfmr-lm"
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
# Passive waiting: ctest runs cases side by side on few cores, where spinning
# OpenMP threads of one process starve the other.
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive

fail() { echo "FAIL: $*" >&2; exit 1; }
# expect_error "message part" command...: must exit non-zero and print the message.
expect_error() {
  local want=$1; shift
  local out
  out=$("$@" 2>&1) && fail "expected failure of: $* (got success: $out)"
  grep -qF -- "$want" <<<"$out" || fail "expected '$want' from: $*; got: $out"
}
# same A B: checkpoints A and B hold the same files, byte for byte.
same() { for f in model.safetensors optimizer.safetensors trainer_state.json; do
           cmp -s "$1/$f" "$2/$f" || fail "$2/$f differs from $1/$f"; done; }
json_value() { sed -n "s/.*\"$2\": *\\([-0-9.e+]*\\).*/\\1/p" "$1" | head -1; }

# A small corpus of our own with regular structure, so a few steps learn something.
make_corpus() {
  for i in $(seq 1 400); do
    echo "the cat sat on the mat $((i % 7)) times."
    echo "a dog ran to the park $((i % 5)) days ago."
  done > corpus.txt
}
# Toy sentiment data: the label follows the sentiment words.
make_tsv() {
  local n=$1 file=$2 pos=(good great fine lovely superb) neg=(bad awful poor dull boring) fill=(the film was a plot and it)
  echo -e "label\tsentence" > "$file"
  for i in $(seq 1 "$n"); do
    if ((i % 2)); then w=${pos[$((i % 5))]}; l=1; else w=${neg[$((i % 5))]}; l=0; fi
    echo -e "$l\t${fill[$((i % 7))]} ${fill[$(((i + 3) % 7))]} $w ${fill[$(((i + 1) % 7))]}" >> "$file"
  done
}
# A toy translation task: each source word maps to one target word.
make_parallel() {  # make_parallel N PREFIX
  local src=(red blue green big small cat dog bird sees eats) tgt=(rouge bleu vert grand petit chat chien oiseau voit mange)
  : > "$2.src"; : > "$2.tgt"
  for i in $(seq 1 "$1"); do
    local a=$((i % 10)) b=$(((i * 7 + 3) % 10)) c=$(((i * 3 + 1) % 10)) n=$((3 + i % 4)) s="" t=""
    for k in $(seq 1 "$n"); do
      local w=$(((a + b * k + c * k * k) % 10)); s+="${src[$w]} "; t+="${tgt[$w]} "
    done
    echo "${s% }." >> "$2.src"; echo "${t% }." >> "$2.tgt"
  done
}
train_tiny() {  # train_tiny STEPS OUT [extra...]
  local steps=$1 out=$2; shift 2
  "$charlm" train --data corpus.txt --model tiny --steps "$steps" --batch 8 --lr 3e-3 --eval-every 10 \
    --eval-batches 4 --samples 0 --out "$out" --log-csv "$out.csv" --report "$out.html" "$@"
}

case "$case_name" in
  charlm_help)
    # (the whole help read first: grep -q stopping early would break the pipe)
    grep -q -- "--resume" <<< "$("$charlm" train --help)" || fail "train --help lacks --resume"
    grep -q -- "--recompute" <<< "$("$charlm" train --help)" || fail "train --help lacks --recompute"
    grep -q -- "--top-p" <<< "$("$charlm" sample --help)" || fail "sample --help lacks --top-p"
    ;;
  presets_help)
    # Every program's --help lists exactly the presets its --model accepts:
    # the list --help prints, the list an unknown name's error gives, and
    # each of those names accepted (the run gets past --model to the data).
    help_list() { "$@" --help | tr '\n' ' ' | tr -s ' ' | sed -n 's/.*preset: \([a-z0-9-]*\(, [a-z0-9-]*\)*\).*/\1/p'; }
    error_list() { "$@" --model nonesuch 2>&1 | sed -n "s/.*unknown model 'nonesuch' (choose from \(.*\))/\1/p"; }
    check_lists() {  # check_lists "a command that takes --model and fails on its missing data"
      local h e
      h=$(help_list "$@") e=$(error_list "$@")
      [[ -n $h && $h == "$e" ]] || fail "$*: --help lists '$h', --model accepts '$e'"
      for m in ${h//,/ }; do
        ! "$@" --model "$m" 2>&1 | grep -q "unknown model" || fail "$*: --help lists $m, which --model refuses"
      done
      echo "$h"
    }
    lm=$(check_lists "$charlm" train --data missing.txt)
    [[ $lm == *shakespeare-llama* ]] || fail "xfmr-charlm's presets lack shakespeare-llama: $lm"
    [[ $(check_lists "$bin/../benchmark/xfmr-bench" --backend cpu --modes nonesuch) == "$lm" ]] \
      || fail "xfmr-bench and xfmr-charlm list other language-model presets"
    check_lists "$classify" train --train missing.tsv --dev missing.tsv > /dev/null
    check_lists "$translate" train --src-train m.src --tgt-train m.tgt --src-val m.src --tgt-val m.tgt > /dev/null
    # --help works with or without a command.
    for p in "$charlm" "$classify" "$translate"; do "$p" --help 2>&1 | grep -q "usage" || fail "$p --help"; done
    ;;
  charlm_train_sample)
    make_corpus
    train_tiny 60 ckpt --metrics-json m.json > train.log 2>&1 || { cat train.log; fail "training failed"; }
    grep -q "step 60: train loss" train.log || fail "no evaluation line in the output"
    first=$(json_value m.json first_batch_loss) final=$(json_value m.json train_loss)
    awk -v a="$first" -v b="$final" 'BEGIN { exit !(b < a - 1.0) }' || fail "loss did not decrease enough: $first -> $final"
    [[ -s ckpt.csv && -s ckpt.html ]] || fail "no CSV log or HTML report"
    grep -q "<svg" ckpt.html || fail "the report has no SVG chart"
    out=$("$charlm" sample --checkpoint ckpt --prompt "the cat" --tokens 40 --seed 3) || fail "sampling failed"
    [[ $out == "the cat"* && ${#out} -ge 47 ]] || fail "sample does not continue the prompt: $out"
    again=$("$charlm" sample --checkpoint ckpt --prompt "the cat" --tokens 40 --seed 3)
    [[ $out == "$again" ]] || fail "sampling with one seed is not reproducible"
    # The KV cache gives the same tokens as recomputing the context (within MAX_T = 16).
    cached=$("$charlm" sample --checkpoint ckpt --prompt "a dog" --tokens 11 --temperature 0 2>/dev/null) || fail "greedy failed"
    plain=$("$charlm" sample --checkpoint ckpt --prompt "a dog" --tokens 11 --temperature 0 --no-cache 2>/dev/null)
    [[ $cached == "$plain" ]] || fail "cached and recomputed generation differ: '$cached' vs '$plain'"
    cached=$("$charlm" sample --checkpoint ckpt --prompt "the" --tokens 13 --seed 9 2>/dev/null)
    plain=$("$charlm" sample --checkpoint ckpt --prompt "the" --tokens 13 --seed 9 --no-cache 2>/dev/null)
    [[ $cached == "$plain" ]] || fail "cached and recomputed sampling differ: '$cached' vs '$plain'"
    # The Llama-style preset (rotary positions in the cache) trains, saves and decodes alike.
    "$charlm" train --data corpus.txt --model shakespeare-llama --steps 30 --batch 8 --eval-every 30 --eval-batches 2 \
      --samples 0 --out llama --log-csv "" --report "" > llama.log 2>&1 || { cat llama.log; fail "shakespeare-llama failed"; }
    grep -q "^xfmr-charlm: shakespeare-llama on cpu" llama.log || fail "the run did not say it trained shakespeare-llama"
    cached=$("$charlm" sample --checkpoint llama --prompt "the" --tokens 20 --temperature 0 2>/dev/null) || fail "llama greedy failed"
    plain=$("$charlm" sample --checkpoint llama --prompt "the" --tokens 20 --temperature 0 --no-cache 2>/dev/null)
    [[ $cached == "$plain" ]] || fail "shakespeare-llama: cached and recomputed generation differ"
    ;;
  charlm_names)
    for a in ma li so ka ro be; do for b in ri na la ti; do for c in "" a n e; do echo "$a$b$c"; done; done; done > names.txt
    "$charlm" train --data names.txt --mode names --model tiny --steps 80 --batch 16 --lr 3e-3 --eval-every 40 \
      --eval-batches 50 --samples 60 --out nm --metrics-json m.json --log-csv n.csv --report n.html > train.log 2>&1 \
      || { cat train.log; fail "names training failed"; }
    grep -q "86 train / 10 val names" train.log || fail "names were not split 90/10 by name: $(head -1 train.log)"
    final=$(json_value m.json val_loss)
    awk -v v="$final" 'BEGIN { exit !(v < 2.0) }' || fail "names val loss $final did not fall below 2.0"
    out=$("$charlm" sample --checkpoint nm --tokens 40 --prompt ma --seed 2) || fail "sampling names failed"
    [[ $out == ma* ]] || fail "the sample does not start with the prompt: $out"
    # Split by sequences, the shards weigh by their counted (non-padding)
    # targets: without dropout, 2 shards train and evaluate as 1 does, to
    # float rounding, 3e-6 here (weighing by sequences moves them 5e-4 to 1e-3).
    for n in 1 2; do
      "$charlm" train --data names.txt --mode names --model tiny --steps 20 --batch 16 --lr 3e-3 --dropout 0 \
        --eval-every 20 --eval-batches 50 --samples 0 --shards $n --metrics-json s$n.json --log-csv s$n.csv \
        --report s$n.html > s$n.log 2>&1 || { cat s$n.log; fail "names training with --shards $n failed"; }
    done
    for key in train_loss val_loss; do
      a=$(json_value s1.json $key) b=$(json_value s2.json $key)
      awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 3e-5 * a) }' \
        || fail "names $key: $a with one shard, $b with two"
    done
    ;;
  charlm_resume_bitwise)
    make_corpus
    # Cosine schedule and dropout (branches and attention probabilities): both
    # must continue exactly where they stopped.
    train_tiny 40 full --schedule cosine --attention-dropout 0.1 > /dev/null 2>&1 || fail "the 40-step run failed"
    train_tiny 40 half --schedule cosine --attention-dropout 0.1 --stop-after 20 > half.log 2>&1 \
      || { cat half.log; fail "the 20-step run failed"; }
    grep -q "step 20: train loss" half.log || fail "the first half did not stop at step 20"
    "$charlm" train --data corpus.txt --resume half --steps 40 --samples 0 --eval-batches 4 --log-csv r.csv \
      --report r.html > resume.log 2>&1 || { cat resume.log; fail "resuming failed"; }
    grep -q "resuming at step 20" resume.log || fail "the run did not resume at step 20"
    cmp full/model.safetensors half/model.safetensors || fail "20 + 20 resumed steps differ from 40 steps (model)"
    cmp full/optimizer.safetensors half/optimizer.safetensors || fail "20 + 20 resumed steps differ from 40 steps (optimizer)"
    ;;
  classify_resume_bitwise)
    # 2N steps equal N steps and N resumed, byte for byte (mid-epoch and at
    # an epoch's end; dropout on the residuals and the attention).
    make_tsv 200 train.tsv && make_tsv 40 dev.tsv
    c=(train --train train.tsv --dev dev.tsv --model tiny --epochs 3 --batch 16 --lr 3e-3 --eval-every 10
       --attention-dropout 0.1 --log-csv "" --report "")
    "$classify" "${c[@]}" --out full > full.log 2>&1 || { cat full.log; fail "the whole run failed"; }
    for stop in 20 13; do  # 13 steps an epoch
      "$classify" "${c[@]}" --out half$stop --stop-after $stop > h$stop.log 2>&1 || { cat h$stop.log; fail "stop at $stop"; }
      "$classify" train --train train.tsv --dev dev.tsv --resume half$stop --log-csv "" --report "" > r$stop.log 2>&1 \
        || { cat r$stop.log; fail "resuming at $stop failed"; }
      grep -q "resuming at step $stop" r$stop.log || fail "the run did not resume at step $stop"
      same full half$stop
    done
    expect_error "--lr differs from the checkpoint" "$classify" train --train train.tsv --dev dev.tsv --resume half13 --lr 1
    make_tsv 30 other.tsv
    expect_error "is not the data the checkpoint was trained on" "$classify" train --train other.tsv --dev dev.tsv \
      --resume half13
    ;;
  translate_resume_bitwise)
    make_parallel 200 train && make_parallel 30 val
    t=(train --src-train train.src --tgt-train train.tgt --src-val val.src --tgt-val val.tgt --model tiny --epochs 3
       --batch 32 --lr 3e-3 --min-freq 1 --eval-every 5 --attention-dropout 0.1 --log-csv "" --report "")
    "$translate" "${t[@]}" --out full > full.log 2>&1 || { cat full.log; fail "the whole run failed"; }
    for stop in 10 7; do  # 7 steps an epoch
      "$translate" "${t[@]}" --out half$stop --stop-after $stop > h$stop.log 2>&1 || { cat h$stop.log; fail "stop at $stop"; }
      "$translate" train --src-train train.src --tgt-train train.tgt --src-val val.src --tgt-val val.tgt \
        --resume half$stop --log-csv "" --report "" > r$stop.log 2>&1 || { cat r$stop.log; fail "resuming at $stop failed"; }
      grep -q "resuming at step $stop" r$stop.log || fail "the run did not resume at step $stop"
      same full half$stop
    done
    [[ $(grep "^val BLEU" full.log) == "$(grep "^val BLEU" r7.log)" ]] || fail "the resumed run scored another BLEU"
    ;;
  charlm_bf16)
    # --precision bf16: bf16 products where the processor has AVX512-BF16
    # (the banner says so and training learns as float32's does), float32
    # with a notice elsewhere; its checkpoint resumes in float32.
    make_corpus
    train_tiny 60 b16 --precision bf16 --metrics-json b.json > b.log 2>&1 || { cat b.log; fail "bf16 training failed"; }
    train_tiny 60 f32 --metrics-json f.json > f.log 2>&1 || { cat f.log; fail "float32 training failed"; }
    if grep -q "^xfmr-charlm: tiny on cpu (bf16 products)" b.log; then
      b=$(json_value b.json train_loss) f=$(json_value f.json train_loss)
      awk -v b="$b" -v f="$f" 'BEGIN { exit !(b < f * 1.05 && b > f * 0.95) }' || fail "bf16 train loss $b, float32's $f"
      cmp -s b16/model.safetensors f32/model.safetensors && fail "bf16 trained the same weights as float32"
    else
      grep -q "^note: bf16 precision unavailable (.*); running in float32" b.log || { cat b.log; fail "no notice"; }
      cmp -s b16/model.safetensors f32/model.safetensors || fail "the float32 fallback differs from float32"
    fi
    train_tiny 60 half --precision bf16 --stop-after 30 > /dev/null 2>&1 || fail "bf16, stop at 30"
    "$charlm" train --data corpus.txt --resume half --log-csv "" --report "" > r.log 2>&1 \
      || { cat r.log; fail "the bf16 checkpoint did not resume in float32"; }
    grep -q "^step 60: train loss" r.log || { cat r.log; fail "the resumed run did not reach step 60"; }
    expect_error "unknown --precision 'fp16' (expected fp32, bf16, int8 or q4)" "$charlm" train --data corpus.txt --precision fp16
    expect_error "--precision int8 is for decoding" "$charlm" train --data corpus.txt --precision int8
    # sample --precision bf16 decodes from bf16 weight copies: as many
    # characters as asked, greedy, whether or not the processor has bf16.
    "$charlm" sample --checkpoint f32 --tokens 40 --temperature 0 --precision bf16 > s.txt 2> s.err \
      || { cat s.err; fail "bf16 sampling failed"; }
    [ "$(head -c 40 s.txt | wc -m)" -eq 40 ] || { cat s.txt; fail "bf16 sampling printed too little"; }
    grep -q "40 tokens in .* KV cache" s.err || { cat s.err; fail "bf16 sampling gave no speed line"; }
    expect_error "unknown --precision 'int4' (expected fp32, bf16, int8 or q4)" "$charlm" sample --checkpoint f32 --precision int4
    # sample --precision int8 decodes from int8 weight copies; greedy, its
    # first characters those of float32 on this small model.
    "$charlm" sample --checkpoint f32 --tokens 40 --temperature 0 --precision int8 > s8.txt 2> s8.err \
      || { cat s8.err; fail "int8 sampling failed"; }
    "$charlm" sample --checkpoint f32 --tokens 40 --temperature 0 > s32.txt 2> /dev/null || fail "float32 sampling failed"
    [ "$(head -c 40 s8.txt | wc -m)" -eq 40 ] || { cat s8.txt; fail "int8 sampling printed too little"; }
    [[ $(head -c 8 s8.txt) == "$(head -c 8 s32.txt)" ]] || fail "int8 greedy begins otherwise than float32's"
    # An int8 checkpoint: a quarter-ish of the bytes, decoded in int8 by
    # default; eval gives the training's own validation loss from the float
    # checkpoint and close to it from the int8 one; training refuses it.
    "$charlm" quantise --checkpoint f32 --out f32_int8 > q.log 2>&1 || { cat q.log; fail "quantise failed"; }
    grep -q "weight matrices as int8 in f32_int8" q.log || { cat q.log; fail "quantise said nothing"; }
    # --out (and xfmr-lm's --hf) make missing parents, as mkdir -p does.
    "$charlm" quantise --checkpoint f32 --out nested/a/int8 > /dev/null 2>&1 || fail "quantise into nested/a/int8 failed"
    [[ -f nested/a/int8/model.safetensors ]] || fail "quantise --out nested/a/int8 wrote nothing"
    [ ! -e f32_int8/optimizer.safetensors ] || fail "the int8 checkpoint has optimizer state"
    awk -v a="$(stat -c %s f32_int8/model.safetensors)" -v b="$(stat -c %s f32/model.safetensors)" \
      'BEGIN { exit !(a < 0.4 * b) }' || fail "the int8 model file is not small"
    "$charlm" sample --checkpoint f32_int8 --tokens 40 --temperature 0 > q8.txt 2> q8.err || { cat q8.err; fail "int8 checkpoint sampling failed"; }
    [[ $(head -c 8 q8.txt) == "$(head -c 8 s32.txt)" ]] || fail "the int8 checkpoint's greedy begins otherwise than float32's"
    "$charlm" eval --checkpoint f32 --data corpus.txt --batches 4 --metrics-json v32.json > /dev/null || fail "eval failed"
    "$charlm" eval --checkpoint f32_int8 --data corpus.txt --batches 4 --metrics-json v8.json > /dev/null \
      || fail "int8 eval failed"
    grep -q '"precision": "int8"' v8.json || { cat v8.json; fail "the int8 checkpoint was not evaluated in int8"; }
    awk -v a="$(json_value v8.json val_loss)" -v b="$(json_value v32.json val_loss)" \
      'BEGIN { exit !(a > 0.98 * b && a < 1.02 * b) }' || fail "int8 val loss $(json_value v8.json val_loss)"
    expect_error "holds int8 weights for decoding" "$charlm" train --data corpus.txt --resume f32_int8
    expect_error "into itself" "$charlm" quantise --checkpoint f32 --out f32
    expect_error "int8 weights already" "$charlm" quantise --checkpoint f32_int8 --out again
    expect_error "a float32 checkpoint would be lost" "$charlm" quantise --checkpoint f32 --out b16
    expect_error "not an xfmr-classify checkpoint" "$classify" quantise --checkpoint f32 --out x8
    ;;
  charlm_recompute)
    # --recompute cheap and block train the weights of none bit for bit
    # (dropout on, two shards: the replicas recompute too).
    make_corpus
    for mode in none cheap block; do
      train_tiny 20 "r_$mode" --recompute "$mode" --attention-dropout 0.1 --dropout 0.1 --shards 2 > "$mode.log" 2>&1 \
        || { cat "$mode.log"; fail "training with --recompute $mode failed"; }
    done
    cmp r_none/model.safetensors r_cheap/model.safetensors || fail "--recompute cheap trained other weights"
    cmp r_none/model.safetensors r_block/model.safetensors || fail "--recompute block trained other weights"
    expect_error "unknown recompute mode 'all' (none, cheap or block)" "$charlm" train --data corpus.txt --recompute all
    ;;
  charlm_bad_input)
    make_corpus
    expect_error "missing.txt: no such file" "$charlm" train --data missing.txt --steps 1
    : > empty.txt
    expect_error "empty.txt: file is empty" "$charlm" train --data empty.txt --steps 1
    expect_error "unknown model 'gpt5' (choose from tiny, shakespeare-small" "$charlm" train --data corpus.txt --model gpt5
    expect_error "--data FILE is required" "$charlm" train --steps 1
    expect_error "unrecognised option '--bogus'" "$charlm" train --bogus
    expect_error "--zero 2 is not 0 or 1" "$charlm" train --data corpus.txt --zero 2
    # Boost's message filling looped forever on a value holding its own
    # placeholder (found by fuzz_cli_charlm).
    expect_error "unrecognised option '--％canonical_option％'" timeout 20 "$charlm" train --%canonical_option%
    expect_error "the argument ('％value％') for option '--steps' is invalid" timeout 20 "$charlm" train --steps %value%
    expect_error "--shards -1 is negative" "$charlm" train --data corpus.txt --shards -1
    expect_error "--checkpoint DIR is required (GPT-2 and Llama checkpoints: xfmr-lm sample --model)" "$charlm" sample
    expect_error "--attention-dropout 1 outside [0, 1)" "$charlm" train --data corpus.txt --attention-dropout 1
    # Numbers that make no sense are refused before anything runs (NaN and
    # negative dropout were the preset's, a NaN clip was saved as null).
    expect_error "--dropout nan is not a finite number" "$charlm" train --data corpus.txt --dropout nan
    expect_error "--dropout -0.5 outside [0, 1)" "$charlm" train --data corpus.txt --dropout=-0.5
    expect_error "--clip nan is not a finite number" "$charlm" train --data corpus.txt --clip nan
    expect_error "--lr inf is not a finite number" "$charlm" train --data corpus.txt --lr inf
    # A learning rate that blows the weights up stops training, naming the step.
    expect_error " at step " "$charlm" train --data corpus.txt --model tiny --steps 50 --lr 1e6 --eval-every 25 \
      --eval-batches 1 --samples 0 --log-csv "" --report ""
    train_tiny 10 ckpt > /dev/null 2>&1 || fail "training failed"
    expect_error "prompt: character 'Z' at byte 4 is not in the vocabulary" "$charlm" sample --checkpoint ckpt --prompt "the Zebra"
    expect_error "--model differs from the checkpoint" "$charlm" train --data corpus.txt --resume ckpt --model shakespeare-small
    # A malformed trainer state is one line and status 1, not an abort.
    cp -r ckpt badrng && sed -i 's/"data_rng": "[0-9]*"/"data_rng": "abc"/' badrng/trainer_state.json
    expect_error "xfmr-charlm: error: badrng/trainer_state.json: data_rng 'abc' is not an integer" "$charlm" train \
      --data corpus.txt --resume badrng --steps 20
    status=0; "$charlm" train --data corpus.txt --resume badrng --steps 20 > /dev/null 2>&1 || status=$?
    [[ $status == 1 ]] || fail "a malformed trainer state exited with status $status, not 1"
    echo "other text entirely" > other.txt
    expect_error "is not the text the checkpoint was trained on" "$charlm" train --data other.txt --resume ckpt --steps 20
    expect_error "top-p 0 outside (0, 1]" "$charlm" sample --checkpoint ckpt --top-p 0
    expect_error "not a checkpoint directory" "$charlm" sample --checkpoint .
    mkdir mine && echo keep > mine/notes.txt
    expect_error "is not an xfmr checkpoint" "$charlm" train --data corpus.txt --model tiny --steps 2 --eval-every 1 \
      --eval-batches 1 --samples 0 --out mine
    # Refused before the first step, not after the training it would throw away.
    out=$("$charlm" train --data corpus.txt --model tiny --steps 2 --eval-every 1 --eval-batches 1 --samples 0 \
      --out mine 2>&1) && fail "training over a user's directory succeeded"
    ! grep -q "train loss" <<<"$out" || fail "training ran before --out was refused: $out"
    [[ $(cat mine/notes.txt) == keep && $(ls mine | wc -l) == 1 ]] || fail "a user's directory was modified"
    # Outputs never replace an input or a checkpoint the run was not handed
    # (issue 29: --log-csv over the corpus, --out over an earlier run).
    sum=$(md5sum < corpus.txt)
    expect_error "refusing to write --log-csv corpus.txt: it is the --data input" "$charlm" train --data corpus.txt \
      --model tiny --steps 1 --log-csv corpus.txt
    expect_error "refusing to write --report ./corpus.txt: it is the --data input" "$charlm" train --data corpus.txt \
      --model tiny --steps 1 --report ./corpus.txt
    ln corpus.txt hardlink.txt
    expect_error "refusing to write --metrics-json hardlink.txt: it is the --data input" "$charlm" train \
      --data corpus.txt --model tiny --steps 1 --metrics-json hardlink.txt
    [[ $(md5sum < corpus.txt) == "$sum" ]] || fail "the corpus was modified"
    # An output with other hard links is replaced whole, and said so first.
    echo old > shared.json && ln shared.json shared-link.json
    "$charlm" train --data corpus.txt --model tiny --steps 1 --eval-batches 1 --samples 0 --log-csv "" --report "" \
      --metrics-json shared.json > hl.log 2>&1 || { cat hl.log; fail "training with a hard-linked --metrics-json failed"; }
    grep -q "warning: --metrics-json shared.json has 1 other hard link(s); writing it gives shared.json a new file" hl.log ||
      { cat hl.log; fail "no warning of the hard link"; }
    [[ $(cat shared-link.json) == old ]] || fail "the other hard link changed"
    "$charlm" train --data corpus.txt --model tiny --steps 1 --eval-batches 1 --samples 0 --log-csv "" --report "" \
      --out nested/c/ck > /dev/null 2>&1 || fail "training into --out nested/c/ck failed"
    [[ -f nested/c/ck/model.safetensors ]] || fail "--out nested/c/ck: no checkpoint"
    expect_error "--report and --log-csv both name x.csv" "$charlm" train --data corpus.txt --model tiny \
      --steps 1 --log-csv x.csv --report x.csv
    expect_error "--report new/r.html lies inside the checkpoint directory --out new" "$charlm" train \
      --data corpus.txt --model tiny --steps 1 --out new --report new/r.html
    expect_error "--out ckpt holds a checkpoint already: pass --overwrite to replace it" train_tiny 10 ckpt
    before=$(md5sum < ckpt/model.safetensors)
    cp -r ckpt other
    expect_error "(this run resumes another)" "$charlm" train --data corpus.txt --resume other --out ckpt --steps 20
    [[ $(md5sum < ckpt/model.safetensors) == "$before" ]] || fail "a checkpoint was replaced without --overwrite"
    train_tiny 10 ckpt --overwrite > /dev/null 2>&1 || fail "--overwrite did not replace the checkpoint"
    echo mine > ckpt/notes.txt
    expect_error "it holds notes.txt, which is not part of a checkpoint" "$charlm" train --data corpus.txt --resume ckpt \
      --steps 20
    rm ckpt/notes.txt
    # What interrupted saves left beside --out is removed at the start.
    mkdir .ckpt.new.Ab12Cd && cp ckpt/model.safetensors .ckpt.new.Ab12Cd/
    "$charlm" train --data corpus.txt --resume ckpt --steps 12 --eval-batches 1 --samples 0 --log-csv "" --report "" \
      > stale.log 2>&1 || { cat stale.log; fail "resuming failed"; }
    grep -q "removed 1 directory left beside ckpt by interrupted saves" stale.log || fail "no note of the cleanup"
    [[ ! -e .ckpt.new.Ab12Cd ]] || fail "the interrupted save's directory is still there"
    # Sizes and values that make no sense, and what a checkpoint may not hold.
    expect_error "--batch 100000000 outside 1..65536" "$charlm" train --data corpus.txt --batch 100000000
    expect_error ".: is a directory, not a file" "$charlm" train --data . --steps 1
    gzip -c corpus.txt > c.gz && echo "junk" >> c.gz
    expect_error "c.gz: 5 bytes after the gzip data at byte" "$charlm" train --data c.gz --steps 1
    printf 'good text \xff bad\n' > bad8.txt
    expect_error "--data bad8.txt (the character model reads UTF-8 text): invalid UTF-8 at line 1, byte 11 of the line" \
      "$charlm" train --data bad8.txt --steps 1
    train_tiny 10 cos --schedule cosine > /dev/null 2>&1 || fail "the cosine run failed"
    expect_error "--steps 20 differs from the 10 that the checkpoint's cosine schedule spans" "$charlm" train \
      --data corpus.txt --resume cos --steps 20
    cp -r cos bigstep && sed -i 's/"step": [0-9]*/"step": 1e100/' bigstep/trainer_state.json
    expect_error "bigstep/trainer_state.json: step 1e+100 is not an integer" "$charlm" train --data corpus.txt \
      --resume bigstep
    cp -r cos deep && python3 -c "print('[' * 100000 + ']' * 100000)" > deep/trainer_state.json
    expect_error "trainer_state.json nests deeper than 64 levels" "$charlm" train --data corpus.txt --resume deep
    # A learning rate far too high: a warning while the loss grows, a clear
    # error naming the cause when it overflows.
    out=$("$charlm" train --data corpus.txt --model tiny --steps 30 --lr 10 --eval-every 30 --eval-batches 1 \
      --samples 0 --log-csv "" --report "" 2>&1)
    grep -q "warning: the loss has grown from .* training is diverging" <<<"$out" || fail "no divergence warning: $out"
    expect_error "unknown --backend 'tpu' (expected cpu, cuda, cuda-tf32 or cuda-bf16)" "$charlm" train --data corpus.txt \
      --model tiny --backend tpu
    # --backend cuda, cuda-tf32 and cuda-bf16: a clear error without a GPU
    # (or without CUDA in the build); with one, a short run that says where
    # it ran.
    for be in cuda cuda-tf32 cuda-bf16; do
      if "$charlm" train --data corpus.txt --model tiny --steps 4 --eval-every 2 --eval-batches 1 --samples 20 \
           --log-csv $be.csv --report $be.html --backend $be > $be.log 2>&1; then
        grep -q " on cuda (" $be.log || { cat $be.log; fail "--backend $be ran but did not say so"; }
        [[ $be != cuda-tf32 ]] || grep -q "TF32)" $be.log || { cat $be.log; fail "--backend $be did not say TF32"; }
        [[ $be != cuda-bf16 ]] || grep -q "bf16 activations" $be.log || { cat $be.log; fail "--backend $be: no bf16"; }
      else
        grep -qE "no usable CUDA device|built without CUDA" $be.log \
          || { cat $be.log; fail "--backend $be failed without a clear reason"; }
      fi
    done
    ;;
  charlm_crash_safety)
    # SIGKILL at random moments of a run that saves at every step: each time
    # the checkpoint loads, and the next run resumes from it (removing what
    # an interrupted save left). The kill waits for the run's first save, so
    # every round makes progress however slow the machine; no timing is
    # asserted, since every moment must be safe.
    make_corpus
    train_tiny 2 ck > first.log 2>&1 || { cat first.log; fail "the first run failed"; }
    step_of() { sed -n 's/^ *"step": *\([0-9]*\),*$/\1/p' ck/trainer_state.json; }
    RANDOM=29
    last=$(step_of) kills=0
    for round in $(seq 1 24); do
      "$charlm" train --data corpus.txt --resume ck --steps 1000000 --eval-every 1 --eval-batches 1 --samples 0 \
        --log-csv "" --report "" > run.log 2>&1 &
      pid=$!
      for _ in $(seq 1 6000); do
        [[ $(step_of) != "$last" ]] && break
        kill -0 $pid 2>/dev/null || { cat run.log; fail "round $round: the run ended before its first save"; }
        sleep 0.01
      done
      sleep "0.0$((RANDOM % 10))$((RANDOM % 10))"  # 0 to 99 ms more: into a later step or save
      kill -KILL $pid && wait $pid 2>/dev/null
      kills=$((kills + 1))
      out=$("$charlm" sample --checkpoint ck --tokens 5 2>&1) || fail "round $round: the checkpoint does not load: $out"
      now=$(step_of)
      ((now > last)) || fail "round $round: the checkpoint went from step $last to $now"
      last=$now
    done
    ((kills >= 20)) || fail "only $kills kills"
    # A last run resumes, cleans up and finishes.
    "$charlm" train --data corpus.txt --resume ck --steps $((last + 3)) --eval-every 1 --eval-batches 1 --samples 0 \
      --log-csv "" --report "" > last.log 2>&1 || { cat last.log; fail "the final resume failed"; }
    grep -q "resuming at step $last" last.log || { cat last.log; fail "the final run did not resume at step $last"; }
    [[ $(step_of) == $((last + 3)) ]] || fail "the final run did not reach step $((last + 3))"
    leftovers=$(find . -maxdepth 1 -name '.ck.new.*' | wc -l)
    ((leftovers == 0)) || fail "$leftovers interrupted saves left beside ck"
    echo "$kills kills, the last at step $last"
    ;;
  charlm_distributed)
    # mpirun -n 2: the same checkpoint, bit for bit, as one process that
    # splits each batch in two shards; a checkpoint written at 2 ranks
    # resumes at 1 and at 2; ranks that disagree, throw or die end the job.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
    mpi="mpiexec -n 2 --oversubscribe"
    make_corpus
    base=(train --data corpus.txt --model tiny --batch 8 --eval-batches 2 --samples 0 --dropout 0 --log-csv ""
          --report "")
    run=("${base[@]}" --steps 12 --eval-every 6)
    "$charlm" "${run[@]}" --shards 2 --out one > one.log 2>&1 || { cat one.log; fail "one process failed"; }
    $mpi "$charlm" "${run[@]}" --shards 1 --out two > two.log 2>&1 || { cat two.log; fail "two ranks failed"; }
    same one two
    [[ $(grep -c "^step 12:" two.log) == 1 ]] || { cat two.log; fail "rank 1 printed too"; }
    grep -q "2 ranks of 4 sequences" two.log || fail "no word of the ranks"
    $mpi "$charlm" "${run[@]}" --shards 1 --stop-after 6 --out half > /dev/null 2>&1 || fail "two ranks, stop at 6"
    cp -r half half2
    "$charlm" train --data corpus.txt --resume half --shards 2 --log-csv "" --report "" > /dev/null 2>&1 \
      || fail "the 2-rank checkpoint did not resume in one process"
    same one half
    $mpi "$charlm" train --data corpus.txt --resume half2 --shards 1 --log-csv "" --report "" > /dev/null 2>&1 \
      || fail "the 2-rank checkpoint did not resume at 2 ranks"
    same one half2
    # ZeRO-1: the optimizer's state sharded over the ranks, the same files;
    # its checkpoint resumes in one process.
    $mpi "$charlm" "${run[@]}" --shards 1 --zero 1 --out zero > zero.log 2>&1 || { cat zero.log; fail "ZeRO-1 failed"; }
    same one zero
    $mpi "$charlm" "${run[@]}" --shards 1 --zero 1 --stop-after 6 --out zhalf > /dev/null 2>&1 || fail "ZeRO-1, stop at 6"
    "$charlm" train --data corpus.txt --resume zhalf --shards 2 --log-csv "" --report "" > /dev/null 2>&1 \
      || fail "the ZeRO-1 checkpoint did not resume in one process"
    same one zhalf
    # xfmr-lm too: two ranks train the checkpoint one process of two shards does.
    lmrun=(train --preset tiny --tokenizer "$here/../reference/fixtures/lm/tokenizer.json" --data corpus.txt --steps 8
           --batch 8 --eval-every 4 --eval-windows 4 --dropout 0 --log-csv "" --report "")
    "$lm" "${lmrun[@]}" --shards 2 --out lm-one > lm-one.log 2>&1 || { cat lm-one.log; fail "xfmr-lm, one process"; }
    $mpi "$lm" "${lmrun[@]}" --shards 1 --out lm-two > lm-two.log 2>&1 || { cat lm-two.log; fail "xfmr-lm, two ranks"; }
    same lm-one lm-two
    grep -q "2 ranks of 4 sequences" lm-two.log || fail "xfmr-lm says nothing of the ranks"
    # Different settings on the two ranks (mpiexec's A : B form).
    expect_error "ranks disagree on the options: at argument 22 rank 0 has 'nothing more', rank 1 has '--lr 0.002'" mpiexec -n 1 "$charlm" "${run[@]}" : -n 1 \
      "$charlm" "${run[@]}" --lr 0.002
    # Options that only shape the collective calls (--eval-batches: how many
    # evaluations sum their losses) hung or ended in MPI_ERR_TRUNCATE.
    other=("${run[@]}") && [[ ${other[7]} == --eval-batches ]] && other[8]=3
    expect_error "ranks disagree on the options: at argument 9 rank 0 has '--eval-batches 2', rank 1 has '--eval-batches 3'" \
      timeout 60 mpiexec -n 1 "$charlm" "${run[@]}" : -n 1 "$charlm" "${other[@]}"
    # A rank that throws: rank 1 cannot read its data.
    expect_error "xfmr-charlm (rank 1): error: missing.txt: no such file" \
      timeout 60 mpiexec -n 1 "$charlm" "${run[@]}" : -n 1 "$charlm" "${run[@]/corpus.txt/missing.txt}"
    # A rank that dies: SIGKILL to rank 1 mid-run; the job ends within 30 s, naming it.
    long=("${base[@]}" --steps 1000000 --eval-every 1000000)
    mpiexec -n 1 "$charlm" "${long[@]}" : -n 1 bash -c 'echo $$ > rank1.pid; exec "$0" "$@"' "$charlm" "${long[@]}" \
      > killed.log 2>&1 &
    job=$!
    for _ in $(seq 1 200); do [[ -s rank1.pid ]] && grep -q "^xfmr-charlm: tiny" killed.log && break; sleep 0.1; done
    grep -q "^xfmr-charlm: tiny" killed.log || { kill -KILL $job; cat killed.log; fail "the 2-rank run did not start"; }
    sleep 1
    kill -0 $job 2>/dev/null || { cat killed.log; fail "the 2-rank run ended before a rank was killed"; }
    kill -KILL "$(cat rank1.pid)"
    start=$SECONDS
    for _ in $(seq 1 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
    kill -0 $job 2>/dev/null && { kill -KILL $job; fail "rank 0 still running 30 s after rank 1 died"; }
    wait $job && fail "the job exited 0 after a rank died"
    grep -q "process rank 1 .* exited on signal 9" killed.log || { cat killed.log; fail "the job's end does not name rank 1"; }
    echo "a killed rank ended the job in $((SECONDS - start)) s"
    ;;
  classify_translate_distributed)
    # xfmr-classify and xfmr-translate under mpirun -n 2, plain and ZeRO-1:
    # the checkpoint and the printed results of one process with two shards,
    # bit for bit. 401 examples in batches of 16 end on a batch of one, which
    # rank 1 has no part of.
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
    mpi="mpiexec -n 2 --oversubscribe"
    # against_one PROGRAM NAME ARGS...: one process with two shards, then two
    # ranks plain and with ZeRO-1; the same checkpoint and printed results
    # (the progress lines, the banner and the durations that end a line aside:
    # those are the clock's, not the results').
    against_one() {
      local program=$1 name=$2; shift 2
      results() { grep -v "^xfmr-\|/.* tok/s\|/.* ETA" "$1" | sed 's/, [0-9]*:[0-9:]*$//'; }
      "$program" "$@" --shards 2 --out "$name"1 > "$name"1.log 2>&1 || { cat "$name"1.log; fail "$name, one process"; }
      for z in 0 1; do
        $mpi "$program" "$@" --shards 1 --zero $z --out "$name"2z$z > "$name"2z$z.log 2>&1 \
          || { cat "$name"2z$z.log; fail "$name, 2 ranks, --zero $z"; }
        same "$name"1 "$name"2z$z
        [[ $(results "$name"1.log) == "$(results "$name"2z$z.log)" ]] \
          || { diff "$name"1.log "$name"2z$z.log; fail "$name printed other results at 2 ranks, --zero $z"; }
      done
    }
    make_tsv 401 train.tsv && make_tsv 60 dev.tsv
    c=(train --train train.tsv --dev dev.tsv --model tiny --epochs 2 --batch 16 --lr 3e-3 --eval-every 20 --log-csv ""
       --report "")
    against_one "$classify" c "${c[@]}"
    grep -q "401 train / 60 dev examples, 52 steps, 2 ranks" c2z0.log || { cat c2z0.log; fail "no word of the ranks"; }
    # The losses, and the BLEU of the translations the two ranks made half each.
    make_parallel 301 train && make_parallel 40 val
    against_one "$translate" t train --src-train train.src --tgt-train train.tgt --src-val val.src --tgt-val val.tgt \
      --model tiny --epochs 3 --batch 32 --lr 3e-3 --min-freq 1 --eval-every 10 --log-csv "" --report ""
    grep -q "^val BLEU" t2z0.log || fail "no BLEU"
    expect_error "ranks disagree on the options" mpiexec -n 1 "$classify" "${c[@]}" : -n 1 "$classify" "${c[@]}" --zero 1
    ;;
  classify_train_eval)
    make_tsv 400 train.tsv && make_tsv 60 dev.tsv
    "$classify" train --train train.tsv --dev dev.tsv --model tiny --epochs 4 --batch 16 --lr 3e-3 --eval-every 50 \
      --out clf --metrics-json m.json --log-csv c.csv --report c.html > train.log 2>&1 || { cat train.log; fail "training failed"; }
    acc=$(json_value m.json dev_accuracy)
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.95) }' || fail "dev accuracy $acc on separable toy data"
    "$classify" eval --checkpoint clf --dev dev.tsv --metrics-json e.json > eval.log || fail "eval failed"
    [[ $(json_value e.json dev_accuracy) == "$acc" ]] || fail "eval accuracy $(json_value e.json dev_accuracy) != $acc"
    "$classify" eval --checkpoint clf --dev dev.tsv --precision bf16 --metrics-json e16.json > e16.log 2>&1 \
      || { cat e16.log; fail "bf16 eval failed"; }
    awk -v a="$(json_value e16.json dev_accuracy)" 'BEGIN { exit !(a >= 0.95) }' || fail "bf16 dev accuracy"
    "$classify" eval --checkpoint clf --dev dev.tsv --precision int8 --metrics-json e8.json > e8.log 2>&1 \
      || { cat e8.log; fail "int8 eval failed"; }
    awk -v a="$(json_value e8.json dev_accuracy)" 'BEGIN { exit !(a >= 0.95) }' || fail "int8 dev accuracy"
    "$classify" quantise --checkpoint clf --out clf8 > q.log 2>&1 || { cat q.log; fail "quantise failed"; }
    "$classify" eval --checkpoint clf8 --dev dev.tsv --metrics-json q8.json > q8.log 2>&1 \
      || { cat q8.log; fail "int8 checkpoint eval failed"; }
    awk -v a="$(json_value q8.json dev_accuracy)" 'BEGIN { exit !(a >= 0.95) }' || fail "int8 checkpoint dev accuracy"
    "$classify" train --train train.tsv --dev dev.tsv --model tiny --tokens char --pooling cls --epochs 1 --batch 16 \
      --eval-every 100 --log-csv c2.csv --report c2.html > /dev/null 2>&1 || fail "char tokens with CLS pooling failed"
    ;;
  classify_truncate_normalize)
    # The label word comes last, after 40 words of filler, in varying case and
    # glued to punctuation and an HTML line break: only --truncate tail sees it
    # within tiny's 32 tokens, and --normalize lower makes "Good.<br />" "good".
    make_long() {  # make_long N FILE
      local pos=(Good GOOD good.) neg=(Bad BAD bad.) filler
      filler=$(printf 'the %.0s' $(seq 1 40))
      echo -e "label\tsentence" > "$2"
      for i in $(seq 1 "$1"); do
        if ((i % 2)); then echo -e "1\t$filler${pos[$((i % 3))]}<br />"; else echo -e "0\t$filler${neg[$((i % 3))]}<br />"; fi
      done >> "$2"
    }
    make_long 200 train.tsv && make_long 40 dev.tsv
    for t in head tail; do
      "$classify" train --train train.tsv --dev dev.tsv --model tiny --epochs 6 --batch 16 --lr 3e-3 --eval-every 100 \
        --normalize lower --truncate $t --out ck_$t --metrics-json $t.json --log-csv "" --report "" > $t.log 2>&1 \
        || { cat $t.log; fail "training with --truncate $t failed"; }
      grep -q "note: 200 of 200 train examples are longer than the model's 32 tokens; it reads the \(first\|last\) 32" \
        $t.log || { cat $t.log; fail "no truncation note for --truncate $t"; }
    done
    # The vocabulary: <pad> <unk> <cls>, then the . good bad: no case variants, no HTML.
    grep -q "word vocabulary 7," tail.log || { cat tail.log; fail "--normalize lower did not merge Good, GOOD and good."; }
    awk -v a="$(json_value tail.json dev_accuracy)" 'BEGIN { exit !(a == 1) }' || fail "tail: accuracy $(json_value tail.json dev_accuracy)"
    awk -v a="$(json_value head.json dev_accuracy)" 'BEGIN { exit !(a == 0.5) }' || fail "head: accuracy $(json_value head.json dev_accuracy)"
    # eval keeps the checkpoint's end unless told otherwise.
    "$classify" eval --checkpoint ck_tail --dev dev.tsv --metrics-json e.json > /dev/null || fail "eval failed"
    awk -v a="$(json_value e.json dev_accuracy)" 'BEGIN { exit !(a == 1) }' || fail "eval of the tail model: $(json_value e.json dev_accuracy)"
    "$classify" eval --checkpoint ck_tail --dev dev.tsv --truncate head --metrics-json e.json > /dev/null || fail "eval failed"
    awk -v a="$(json_value e.json dev_accuracy)" 'BEGIN { exit !(a == 0.5) }' || fail "eval --truncate head saw the label"
    expect_error "unknown --truncate 'middle' (expected head or tail)" "$classify" train --train train.tsv \
      --dev dev.tsv --truncate middle
    expect_error "unknown --normalize 'upper' (expected none, words or lower)" "$classify" train --train train.tsv \
      --dev dev.tsv --normalize upper
    expect_error "--max-vocab applies to word tokens only" "$classify" train --train train.tsv --dev dev.tsv \
      --tokens char --max-vocab 10
    ;;
  classify_bad_input)
    make_tsv 20 good.tsv
    printf 'label\tsentence\n1\tfine\n0 no tab\n' > notab.tsv
    printf 'label\tsentence\nyes\tfine\n' > badlabel.tsv
    expect_error "notab.tsv:3: no tab between label and text" "$classify" train --train notab.tsv --dev good.tsv --model tiny
    expect_error "badlabel.tsv:2: label 'yes' is not an integer" "$classify" train --train good.tsv --dev badlabel.tsv --model tiny
    expect_error "unknown model 'bert'" "$classify" train --train good.tsv --dev good.tsv --model bert
    expect_error "--shards -1 is negative" "$classify" train --train good.tsv --dev good.tsv --model tiny --shards -1
    expect_error "--lr -1 must be a positive finite number" "$classify" train --train good.tsv --dev good.tsv --lr=-1
    expect_error "missing.tsv: no such file" "$classify" train --train missing.tsv --dev good.tsv
    printf 'label\tsentence\n7\tgood film\n' > label7.tsv
    expect_error "has label 7 but the model has 2 classes" "$classify" train --train good.tsv --dev label7.tsv --model tiny --epochs 1
    printf 'label\tsentence\n100000000\tfine\n' > hugelabel.tsv
    expect_error "hugelabel.tsv:2: label 100000000 outside 0..65535" "$classify" train --train hugelabel.tsv --dev good.tsv
    expect_error "--batch 100000000 outside 1..65536" "$classify" train --train good.tsv --dev good.tsv --batch 100000000
    expect_error "refusing to write --log-csv good.tsv: it is the --train input" "$classify" train --train good.tsv \
      --dev good.tsv --log-csv good.tsv
    printf 'label\tsentence\n1\tfine \xff film\n' > bad8.tsv
    expect_error "bad8.tsv: invalid UTF-8 at line 2, byte 8 of the line" "$classify" train --train bad8.tsv \
      --dev good.tsv --model tiny --tokens char
    "$classify" train --train good.tsv --dev good.tsv --model tiny --epochs 1 --out ck --log-csv "" --report "" \
      > /dev/null 2>&1 || fail "a short training run failed"
    expect_error "--out ck holds a checkpoint already" "$classify" train --train good.tsv --dev good.tsv --model tiny \
      --epochs 1 --out ck
    expect_error "refusing to write --metrics-json good.tsv: it is the --dev input" "$classify" eval --checkpoint ck \
      --dev good.tsv --metrics-json good.tsv
    # Inputs longer than the model reads are counted and reported.
    { cat good.tsv; printf '1\t%s\n' "$(printf 'good %.0s' $(seq 1 40))"; } > long.tsv
    out=$("$classify" eval --checkpoint ck --dev long.tsv --metrics-json long.json) || fail "eval of long.tsv failed"
    grep -q "note: 1 of 21 dev examples are longer than the model's 32 tokens" <<<"$out" || fail "no note: $out"
    [[ $(json_value long.json dev_truncated) == 1 ]] || fail "the metrics do not count the cut example"
    ;;
  translate_train_translate)
    make_parallel 600 train && make_parallel 40 val
    "$translate" train --src-train train.src --tgt-train train.tgt --src-val val.src --tgt-val val.tgt --model tiny \
      --epochs 40 --batch 32 --lr 3e-3 --min-freq 1 --eval-every 200 --out tr --metrics-json m.json \
      --log-csv t.csv --report t.html > train.log 2>&1 || { cat train.log; fail "training failed"; }
    bleu=$(json_value m.json bleu)
    awk -v b="$bleu" 'BEGIN { exit !(b >= 90) }' || fail "BLEU $bleu on a word-for-word toy task"
    "$translate" eval --checkpoint tr --src val.src --ref val.tgt --metrics-json e.json > eval.log || fail "eval failed"
    [[ $(json_value e.json bleu) == "$bleu" ]] || fail "eval BLEU $(json_value e.json bleu) != training's $bleu"
    # Decoding from bf16 weight copies (or float32, with a notice, without bf16): the toy task still translates.
    "$translate" eval --checkpoint tr --src val.src --ref val.tgt --precision bf16 --metrics-json e16.json > e16.log 2>&1 \
      || { cat e16.log; fail "bf16 eval failed"; }
    awk -v b="$(json_value e16.json bleu)" 'BEGIN { exit !(b >= 90) }' || fail "bf16 BLEU $(json_value e16.json bleu)"
    # int8 weight copies (beam search: a few rows a product read the int8 rows directly).
    "$translate" eval --checkpoint tr --src val.src --ref val.tgt --precision int8 --metrics-json e8.json > e8.log 2>&1 \
      || { cat e8.log; fail "int8 eval failed"; }
    awk -v b="$(json_value e8.json bleu)" 'BEGIN { exit !(b >= 90) }' || fail "int8 BLEU $(json_value e8.json bleu)"
    "$translate" quantise --checkpoint tr --out tr8 > q.log 2>&1 || { cat q.log; fail "quantise failed"; }
    "$translate" eval --checkpoint tr8 --src val.src --ref val.tgt --metrics-json q8.json > q8.log 2>&1 \
      || { cat q8.log; fail "int8 checkpoint eval failed"; }
    awk -v b="$(json_value q8.json bleu)" 'BEGIN { exit !(b >= 90) }' || fail "int8 checkpoint BLEU $(json_value q8.json bleu)"
    out=$(echo "red cat sees blue bird." | "$translate" translate --checkpoint tr --beam 1 --attention-map map.svg) \
      || fail "translate failed"
    [[ -n $out && -s map.svg ]] || fail "no translation or no attention map"
    grep -q "<svg" map.svg || fail "the attention map is not SVG"
    # A word the vocabulary lacks reads as <unk>: the sentence still translates.
    unk=$(echo "red zebra sees blue bird." | "$translate" translate --checkpoint tr) || fail "an unknown word failed"
    [[ -n $unk ]] || fail "no translation of a sentence with an unknown word"
    ;;
  translate_bpe_shared)
    # BPE pieces learned from the data, one joint vocabulary and embedding table.
    make_parallel 600 train && make_parallel 40 val
    "$translate" train --src-train train.src --tgt-train train.tgt --src-val val.src --tgt-val val.tgt --model tiny \
      --tokens bpe --bpe-vocab 320 --share-embeddings --epochs 40 --batch 32 --lr 3e-3 --eval-every 200 --out tr \
      --metrics-json m.json --log-csv t.csv --report t.html > train.log 2>&1 || { cat train.log; fail "training failed"; }
    grep -q "one joint bpe vocabulary 320" train.log || { cat train.log; fail "no joint BPE vocabulary"; }
    bleu=$(json_value m.json bleu)
    awk -v b="$bleu" 'BEGIN { exit !(b >= 80) }' || fail "BLEU $bleu on a word-for-word toy task with BPE"
    grep -aqF '\"tokens\":\"bpe\"' tr/model.safetensors || fail "the checkpoint does not record BPE"
    grep -aqF '\"share_embeddings\":true' tr/model.safetensors || fail "the checkpoint does not record sharing"
    "$translate" eval --checkpoint tr --src val.src --ref val.tgt --metrics-json e.json > eval.log || fail "eval failed"
    [[ $(json_value e.json bleu) == "$bleu" ]] || fail "eval BLEU $(json_value e.json bleu) != training's $bleu"
    out=$(echo "red zebra sees blue bird." | "$translate" translate --checkpoint tr --attention-map map.svg) \
      || fail "an unseen word failed under BPE"
    [[ -n $out ]] && grep -q "<svg" map.svg || fail "no translation or attention map"
    expect_error "--tokens chars is not word or bpe" "$translate" train --src-train train.src --tgt-train train.tgt \
      --src-val val.src --tgt-val val.tgt --model tiny --tokens chars
    expect_error "BPE vocabulary size 100 is below the 261 base symbols" "$translate" train --src-train train.src \
      --tgt-train train.tgt --src-val val.src --tgt-val val.tgt --model tiny --tokens bpe --bpe-vocab 100
    ;;
  translate_bad_input)
    make_parallel 50 a && make_parallel 10 v
    head -n 40 a.tgt > short.tgt
    expect_error "a.src has 50 lines but short.tgt has 40" "$translate" train --src-train a.src --tgt-train short.tgt \
      --src-val v.src --tgt-val v.tgt --model tiny
    expect_error "--shards -1 is negative" "$translate" train --src-train a.src --tgt-train a.tgt \
      --src-val v.src --tgt-val v.tgt --model tiny --shards -1
    expect_error "--lr -1 must be a positive finite number" "$translate" train --src-train a.src --tgt-train a.tgt \
      --src-val v.src --tgt-val v.tgt --model tiny --lr=-1
    sed '5s/.*//' a.src > gap.src && echo "trailing" >> gap.src
    sed -n '1,50p' a.tgt > gap.tgt && echo "fin" >> gap.tgt
    expect_error "gap.src:5: empty sentence" "$translate" train --src-train gap.src --tgt-train gap.tgt \
      --src-val v.src --tgt-val v.tgt --model tiny
    { cat a.src; printf 'red %.0s' $(seq 1 30); echo; } > long.src && { cat a.tgt; echo "rouge"; } > long.tgt
    expect_error "long.src:51: sentence of 30 tokens exceeds the model's limit of 23" "$translate" train \
      --src-train long.src --tgt-train long.tgt --src-val v.src --tgt-val v.tgt --model tiny
    "$translate" train --src-train a.src --tgt-train a.tgt --src-val v.src --tgt-val v.tgt --model tiny --epochs 1 \
      --out ck --log-csv c.csv --report c.html > /dev/null 2>&1 || fail "a short training run failed"
    expect_error "--beam 0 outside 1..100" "$translate" translate --checkpoint ck --beam 0 --input v.src
    expect_error "--beam 1000000 outside 1..100" "$translate" translate --checkpoint ck --beam 1000000 --input v.src
    expect_error "no sentences to translate: standard input held none" "$translate" translate --checkpoint ck < /dev/null
    expect_error "refusing to write --metrics-json v.src: it is the --src input" "$translate" eval --checkpoint ck \
      --src v.src --ref v.tgt --metrics-json v.src
    expect_error "--out ck holds a checkpoint already" "$translate" train --src-train a.src --tgt-train a.tgt \
      --src-val v.src --tgt-val v.tgt --model tiny --epochs 1 --out ck
    expect_error "unknown model 'marian'" "$translate" train --src-train a.src --tgt-train a.tgt --src-val v.src \
      --tgt-val v.tgt --model marian
    mkdir mine && echo keep > mine/notes.txt
    expect_error "is not an xfmr checkpoint" "$translate" train --src-train a.src --tgt-train a.tgt --src-val v.src \
      --tgt-val v.tgt --model tiny --epochs 1 --out mine
    [[ $(cat mine/notes.txt) == keep ]] || fail "a user's directory was modified"
    ;;
  reliability)
    # Issue 39's classes: each fails with one line before training (or, for
    # signals, saves what the run has), and nothing the user saved is lost.
    make_corpus && make_tsv 40 good.tsv && make_parallel 50 a && make_parallel 10 v
    bench="$bin/../benchmark/xfmr-bench"
    quick=(--model tiny --steps 4 --eval-every 2 --eval-batches 1 --samples 0)
    # before_training "message" command...: the error, and no step was run.
    before_training() {
      local out
      out=$("${@:2}" 2>&1) && fail "expected failure of: ${*:2}"
      grep -qF -- "$1" <<<"$out" || fail "expected '$1' from: ${*:2}; got: $out"
      ! grep -q "train loss\|batch loss" <<<"$out" || fail "training ran before the error: ${*:2}"
    }
    # 1. Memory sized by a number or an input: bounded before allocation.
    before_training "--shards 2147483647 outside 0..1024" "$charlm" train --data corpus.txt "${quick[@]}" \
      --shards 2147483647
    expect_error "--vocab has 100000000 tokens, over the limit of 1048576" "$bench" --vocab 100000000 --smoke
    expect_error "--batch 65536: a batch of 65536 sequences of 256 positions would keep at least" "$bench" \
      --model shakespeare-large --batch 65536 --smoke
    expect_error "--attention 1000000 with --batch 1: the materialised path would keep" "$bench" --attention 1000000
    # A translation line of 200,000 distinct words: the vocabulary is built
    # from the words the model reads (--truncate), not from the whole line.
    { seq -f "w%g" 1 200000 | tr '\n' ' '; echo; head -n 49 a.src; } > wide.src
    ( ulimit -v 4000000; "$translate" train --src-train wide.src --tgt-train a.tgt --src-val v.src --tgt-val v.tgt \
        --model tiny --epochs 1 --truncate --min-freq 1 --bleu-sentences 2 --log-csv "" --report "" > wide.log 2>&1 ) \
      || { cat wide.log; fail "a long line with --truncate failed"; }
    grep -q "word vocabularies [0-9]\{1,3\} /" wide.log || { cat wide.log; fail "the vocabulary was built from the whole line"; }
    expect_error "holds only its 3 special tokens: every word would read as <unk>" "$classify" train --train good.tsv \
      --dev good.tsv --model tiny --min-freq 1000000
    # 2. Nothing that could be known at the start fails after training.
    "$charlm" train --data corpus.txt "${quick[@]}" --out slash/ --log-csv "" --report "" > slash.log 2>&1 \
      || { cat slash.log; fail "--out slash/ failed"; }
    [[ -f slash/model.safetensors && $(ls -A slash | wc -l) == 3 ]] || fail "--out slash/ did not save into slash"
    "$charlm" train --data corpus.txt --resume slash/ --steps 6 --log-csv "" --report "" > resume.log 2>&1 \
      || { cat resume.log; fail "--resume slash/ failed"; }
    grep -q "resuming at step 4" resume.log || fail "--resume slash/ did not resume"
    before_training "--metrics-json nodir/m.json: the directory nodir does not exist" "$charlm" train \
      --data corpus.txt "${quick[@]}" --metrics-json nodir/m.json
    before_training "--log-csv nodir/l.csv: the directory nodir does not exist" "$charlm" train --data corpus.txt \
      "${quick[@]}" --log-csv nodir/l.csv
    before_training "--metrics-json run names the checkpoint directory --out" "$charlm" train --data corpus.txt \
      "${quick[@]}" --out run --metrics-json run
    printf 'label\tsentence\n1\tgood film\n0\tcaf\xe9 bad\n' > latin1.tsv
    before_training "latin1.tsv: invalid UTF-8 at line 3, byte 6 of the line" "$classify" train --train latin1.tsv \
      --dev good.tsv --model tiny
    { head -n 3 a.src; printf 'red caf\xe9 cat.\n'; tail -n +5 a.src; } > latin1.src
    before_training "latin1.src: invalid UTF-8 at line 4, byte 8 of the line" "$translate" train \
      --src-train latin1.src --tgt-train a.tgt --src-val v.src --tgt-val v.tgt --model tiny
    { printf 'overlong \xc0\xaf here\n'; cat corpus.txt; } > overlong.txt
    before_training "invalid UTF-8 at line 1, byte 10 of the line" "$charlm" train --data overlong.txt "${quick[@]}"
    { printf 'surrogate \xed\xa0\x80\n'; cat corpus.txt; } > surrogate.txt
    before_training "invalid UTF-8 at line 1, byte 11 of the line" "$charlm" train --data surrogate.txt "${quick[@]}"
    # SIGINT stops at a step boundary with a checkpoint, the log and the
    # report, and exits 1; the run resumes from the checkpoint.
    "$charlm" train --data corpus.txt --model tiny --steps 1000000 --eval-every 1000000 --eval-batches 1 --samples 0 \
      --out sig --log-csv sig.csv --report sig.html > sig.log 2>&1 &
    job=$!
    for _ in $(seq 1 300); do grep -q "^xfmr-charlm: tiny" sig.log && break; sleep 0.1; done
    kill -INT $job
    status=0; wait $job || status=$?
    [[ $status == 1 ]] || { cat sig.log; fail "SIGINT: status $status, not 1"; }
    grep -q "interrupted (SIGINT) after step [0-9]*; the checkpoint sig continues it: --resume sig" sig.log \
      || { cat sig.log; fail "SIGINT: no message"; }
    [[ -f sig/model.safetensors && -s sig.csv && -s sig.html ]] || fail "SIGINT: no checkpoint, log or report"
    stopped=$(sed -n 's/.*interrupted (SIGINT) after step \([0-9]*\).*/\1/p' sig.log)
    [[ $(tail -n 1 sig.csv | cut -d, -f1) == "$stopped" ]] || fail "SIGINT: the log does not end at step $stopped"
    "$charlm" train --data corpus.txt --resume sig --steps $((stopped + 2)) --log-csv "" --report "" > sig2.log 2>&1 \
      || { cat sig2.log; fail "SIGINT: the checkpoint did not resume"; }
    grep -q "resuming at step $stopped" sig2.log || fail "SIGINT: resumed elsewhere"
    # A signal during an evaluation (here of 2^31 - 1 batches) stops it at a
    # batch: the run ends with its checkpoint at once, not after the evaluation.
    "$charlm" train --data corpus.txt --model tiny --steps 10 --eval-every 1 --eval-batches 2147483647 --samples 0 \
      --out esig --log-csv "" --report "" > esig.log 2>&1 &
    job=$!
    for _ in $(seq 1 300); do grep -q "^xfmr-charlm: tiny" esig.log && break; sleep 0.1; done
    sleep 1
    kill -TERM $job
    for _ in $(seq 1 300); do kill -0 $job 2>/dev/null || break; sleep 0.1; done
    kill -0 $job 2>/dev/null && { kill -KILL $job; fail "SIGTERM during an evaluation: still running 30 s later"; }
    status=0; wait $job || status=$?
    [[ $status == 1 ]] && grep -q "interrupted (SIGTERM) after step 1; the checkpoint esig continues it" esig.log ||
      { cat esig.log; fail "SIGTERM during an evaluation: status $status"; }
    grep -q "step 1: stopped by a signal; not evaluated" esig.log || { cat esig.log; fail "no word of the cut evaluation"; }
    [[ -f esig/model.safetensors ]] || fail "SIGTERM during an evaluation: no checkpoint"
    # The translator stopped by SIGTERM keeps its log and report too.
    "$translate" train --src-train a.src --tgt-train a.tgt --src-val v.src --tgt-val v.tgt --model tiny \
      --epochs 100000 --eval-every 1000000 --out tsig --log-csv tsig.csv --report tsig.html > tsig.log 2>&1 &
    job=$!
    for _ in $(seq 1 300); do grep -q "^xfmr-translate: tiny" tsig.log && break; sleep 0.1; done
    kill -TERM $job
    status=0; wait $job || status=$?
    [[ $status == 1 ]] && grep -q "interrupted (SIGTERM)" tsig.log || { cat tsig.log; fail "SIGTERM: status $status"; }
    [[ -f tsig/model.safetensors && -s tsig.csv && -s tsig.html ]] || fail "SIGTERM: no checkpoint, log or report"
    # --attention-map after a translation cut by --truncate or ended at the maximum length.
    "$translate" train --src-train a.src --tgt-train a.tgt --src-val v.src --tgt-val v.tgt --model tiny --epochs 1 \
      --out tk --log-csv "" --report "" > /dev/null 2>&1 || fail "a short translator run failed"
    printf 'red %.0s' $(seq 1 40) > long.txt && echo >> long.txt
    "$translate" translate --checkpoint tk --input long.txt --truncate --attention-map long.svg > long.out 2>&1 \
      || { cat long.out; fail "--attention-map after --truncate failed"; }
    grep -q "<svg" long.svg || fail "no attention map after --truncate"
    # 3. Writes are checked: a full device fails, naming it and the reason.
    expect_error "/dev/full: No space left on device" "$charlm" train --data corpus.txt "${quick[@]}" \
      --metrics-json /dev/full --log-csv "" --report ""
    expect_error "/dev/full: No space left on device" "$charlm" train --data corpus.txt "${quick[@]}" --log-csv /dev/full \
      --report ""
    # A replaced report keeps its permissions.
    "$charlm" train --data corpus.txt "${quick[@]}" --report mode.html --log-csv "" > /dev/null 2>&1 || fail "report run"
    chmod 600 mode.html
    "$charlm" train --data corpus.txt "${quick[@]}" --report mode.html --log-csv "" > /dev/null 2>&1 || fail "report run"
    [[ $(stat -c %a mode.html) == 600 ]] || fail "the replaced report lost its mode: $(stat -c %a mode.html)"
    # 4. One run per --out; a FIFO nobody writes to or reads ends in an error.
    "$charlm" train --data corpus.txt --model tiny --steps 1000000 --eval-every 1000000 --samples 0 --out locked \
      --log-csv "" --report "" > holder.log 2>&1 &
    job=$!
    for _ in $(seq 1 300); do [[ -e .locked.lock ]] && break; sleep 0.1; done
    before_training "another run is writing the checkpoint directory locked (process $job)" "$charlm" train \
      --data corpus.txt "${quick[@]}" --out locked --overwrite
    kill -TERM $job; wait $job
    [[ ! -e .locked.lock ]] || fail "the lock file outlived its run"
    mkfifo silent.fifo
    expect_error "silent.fifo: a FIFO that no process wrote to in 5 s" "$charlm" train --data silent.fifo "${quick[@]}"
    mkfifo deaf.fifo
    expect_error "deaf.fifo: a FIFO that no process opened for reading in 5 s" "$charlm" train --data corpus.txt \
      "${quick[@]}" --report "" --log-csv deaf.fifo
    # 5. No silent values.
    before_training "unexpected argument 'b.txt'" "$charlm" train --data corpus.txt b.txt "${quick[@]}"
    before_training "--stop-after -3 is negative" "$charlm" train --data corpus.txt "${quick[@]}" --stop-after -3
    before_training "--stop-after 0 must be a step of the plan" "$charlm" train --data corpus.txt "${quick[@]}" \
      --stop-after 0
    before_training "--samples -1 is negative" "$charlm" train --data corpus.txt --model tiny --samples -1
    before_training "--seed -1 is negative" "$charlm" train --data corpus.txt "${quick[@]}" --seed -1
    expect_error "--length-penalty nan is not a finite number" "$translate" translate --checkpoint tk \
      --length-penalty nan --input v.src
    expect_error "--length-penalty -1e+300 outside [-10, 10]" "$translate" translate --checkpoint tk \
      --length-penalty -1e300 --input v.src
    before_training "--length-penalty 11 outside [-10, 10]" "$translate" train --src-train a.src --tgt-train a.tgt \
      --src-val v.src --tgt-val v.tgt --model tiny --length-penalty 11
    before_training "--bleu-sentences -5 is negative" "$translate" train --src-train a.src --tgt-train a.tgt \
      --src-val v.src --tgt-val v.tgt --model tiny --bleu-sentences -5
    expect_error "--head -7 is negative" "$translate" translate --checkpoint tk --head -7 --input v.src
    expect_error "--head 9 out of range [0, 2)" "$translate" translate --checkpoint tk --head 9 --input v.src \
      --attention-map h.svg
    expect_error "--attention -5 is negative" "$bench" --attention -5
    # Backend and precision together, and a GPU for a CUDA backend, before
    # a model is loaded (the model named here does not even exist).
    expect_error "--precision int8 runs on the CPU backend (not --backend cuda)" "$lm" sample --model none \
      --backend cuda --precision int8
    expect_error "--precision bf16 goes with --backend cpu, cuda or cuda-bf16 (not cuda-tf32)" "$bench" \
      --backend cuda-tf32 --precision bf16
    if ! nvidia-smi -L > /dev/null 2>&1; then
      out=$("$lm" sample --model none --backend cuda 2>&1) && fail "--backend cuda ran without a GPU: $out"
      grep -qE -- "--backend cuda: (no usable CUDA device|this xfmr was built without CUDA)" <<<"$out" ||
        fail "--backend cuda without a GPU: $out"
    fi
    # Where xfmr-bench writes is checked before it runs (a mode that would
    # take minutes), not after.
    mkdir -p results.d
    expect_error "--json results.d is a directory" "$bench" --json results.d --modes train --min-time 100000
    expect_error "--json gone/r.json: the directory gone does not exist" "$bench" --json gone/r.json --modes train \
      --min-time 100000
    # 6. Messages say what is wrong and where.
    head -c 300 corpus.txt > short.txt
    before_training "--data short.txt: its validation part has 30 characters, too few for windows of the model's context 32" \
      "$charlm" train --data short.txt --model shakespeare-small --steps 2
    printf 'ann\nbob\nchristopherjonathan\nzed\n' > names.txt
    before_training "--data names.txt: the name on line 3 has 19 characters; with its separator that exceeds the model's context of 16" \
      "$charlm" train --data names.txt --mode names --model names --steps 2
    for p in "$charlm" "$classify" "$translate"; do
      "$p" --help > /dev/null || fail "$p --help exited non-zero"
      "$p" train --help > /dev/null || fail "$p train --help exited non-zero"
    done
    ;;
  lm_pretrain_export_finetune)
    # The whole loop of a token-level model: pretrain a GPT-2-shaped preset
    # on one corpus (stopped and resumed bit for bit), export it in the
    # Hugging Face layout, read the export back (the same loss, the same
    # files when exported again), fine-tune from it on a second corpus and
    # beat the starting loss there.
    tok=$here/../reference/fixtures/lm/tokenizer.json
    make_corpus
    for i in $(seq 1 300); do echo "one two three $((i % 9)) four five, six seven $((i % 4)) eight."; done > corpus2.txt
    pretrain() { "$lm" train --preset tiny --tokenizer "$tok" --data corpus.txt --steps 120 --batch 8 --lr 3e-3 \
                   --eval-every 40 --eval-windows 8 --log-csv pre.csv --report pre.html "$@" > /dev/null; }
    pretrain --out pre || fail "pretraining failed"
    pretrain --out half --stop-after 40 || fail "pretraining to step 40 failed"
    pretrain --resume half || fail "resuming the pretraining failed"
    same pre half
    expect_error "--seed differs from the checkpoint in half" pretrain --resume half --seed 5
    "$lm" train --preset tiny --tokenizer "$tok" --data corpus.txt --steps 60 --batch 8 --schedule cosine \
      --stop-after 20 --eval-every 20 --eval-windows 8 --log-csv cos.csv --report cos.html --out cos > /dev/null ||
      fail "the cosine run failed"
    expect_error "--steps 90 differs from the 60 that the checkpoint's cosine schedule spans" "$lm" train \
      --data corpus.txt --resume cos --steps 90
    "$lm" train --data corpus.txt --resume cos --log-csv cos.csv --report cos.html > /dev/null ||
      fail "resuming with the checkpoint's settings alone failed"
    "$lm" export --model pre --hf hf > /dev/null || fail "export failed"
    [[ -f hf/config.json && -f hf/model.safetensors && -f hf/tokenizer.json ]] || fail "the export lacks a file"
    grep -q '"model_type": "gpt2"' hf/config.json || fail "the export is not a GPT-2"
    a=$("$lm" eval --model pre --data corpus2.txt --context 16 --windows 64 | cut -d' ' -f2)
    b=$("$lm" eval --model hf --data corpus2.txt --context 16 --windows 64 | cut -d' ' -f2)
    [[ -n $a && $a == "$b" ]] || fail "the export's loss $b differs from the checkpoint's $a"
    "$lm" export --model hf --hf hf2 > /dev/null || fail "exporting the export failed"
    cmp -s hf/model.safetensors hf2/model.safetensors || fail "export -> import -> export changed the tensors"
    expect_error "exists already" "$lm" export --model pre --hf hf
    "$lm" export --model pre --hf nested/b/hf > /dev/null || fail "export --hf nested/b/hf failed"
    [[ -f nested/b/hf/model.safetensors ]] || fail "export --hf nested/b/hf wrote nothing"
    # The tokenizer travels under its canonical name, whatever its file was
    # called, and an export over an export leaves nothing stale beside it.
    cp "$tok" tok-renamed.json
    "$lm" export --model pre --tokenizer tok-renamed.json --hf hf3 > /dev/null || fail "export with tok-renamed.json failed"
    [[ -f hf3/tokenizer.json && ! -e hf3/tok-renamed.json ]] || fail "the export's tokenizer: $(ls hf3)"
    "$lm" sample --model hf3 --prompt "one" --tokens 4 > /dev/null 2>&1 || fail "sample --model of the export failed"
    echo '{}' > hf3/vocab.json
    "$lm" export --model pre --hf hf3 --overwrite > /dev/null || fail "export --overwrite failed"
    [[ ! -e hf3/vocab.json ]] || fail "export --overwrite left a stale vocab.json"
    ln -s hf3 hf3-link
    expect_error "hf3-link: a symbolic link (to hf3); an export replaces a directory whole" "$lm" export --model pre \
      --hf hf3-link --overwrite
    ln -s pre pre-link
    expect_error "cannot save the checkpoint pre-link: it is a symbolic link (to pre)" "$lm" train --data corpus.txt \
      --resume pre --out pre-link --overwrite
    echo mine > hf3/notes.txt
    expect_error "it holds notes.txt, which is not part of an export" "$lm" export --model pre --hf hf3 --overwrite
    [[ -f hf3/notes.txt ]] || fail "the refused export deleted notes.txt"
    bench="$bin/../benchmark/xfmr-bench"
    "$bench" --pretrained hf --decode-tokens 8 --batch 3 --smoke > bench.txt || fail "xfmr-bench --pretrained failed"
    grep -q "tiny gpt2 checkpoint (B3" bench.txt || fail "xfmr-bench --pretrained: $(cat bench.txt)"
    grep -q "generate_batched.*x one sequence's tokens/s" bench.txt || fail "xfmr-bench --batch 3: $(cat bench.txt)"
    "$lm" train --init hf --data corpus2.txt --steps 60 --batch 8 --lr 1e-3 --eval-every 30 --eval-windows 8 \
      --out ft --metrics-json ft.json --log-csv ft.csv --report ft.html > ft.log || fail "fine-tuning failed: $(cat ft.log)"
    start=$(json_value ft.json start_val_loss) end=$(json_value ft.json val_loss)
    awk -v s="$start" -v e="$end" 'BEGIN { exit !(e < s - 0.1) }' || fail "fine-tuning went from $start to $end"
    "$lm" sample --model ft --prompt "one two" --tokens 20 --temperature 0 > ft.txt 2> /dev/null || fail "sample failed"
    grep -q "^one two" ft.txt || fail "sample lost its prompt: $(cat ft.txt)"
    # A fine-tune's checkpoint stands alone: it carries its tokenizer, and
    # resumes (bit for bit) after its base model and tokenizer have moved.
    [[ -f ft/tokenizer.json ]] || fail "the checkpoint carries no tokenizer: $(ls ft)"
    "$lm" train --init hf --data corpus2.txt --steps 60 --batch 8 --lr 1e-3 --eval-every 30 --eval-windows 8 \
      --out ft-half --stop-after 30 > /dev/null || fail "fine-tuning to step 30 failed"
    mv hf hf-moved
    "$lm" train --data corpus2.txt --resume ft-half > /dev/null || fail "resuming after the base model moved failed"
    mv hf-moved hf
    same ft ft-half
    # The tokenizer file gone after a run began: its checkpoint carries it as it was read, and resumes.
    cp "$tok" tok-gone.json
    "$lm" train --preset tiny --tokenizer tok-gone.json --data corpus.txt --steps 40 --batch 8 --eval-every 20 \
      --eval-windows 4 --out gone --stop-after 20 > /dev/null || fail "training with tok-gone.json failed"
    rm tok-gone.json
    "$lm" train --data corpus.txt --resume gone > /dev/null || fail "resuming once the tokenizer file was gone failed"
    cmp -s gone/tokenizer.json "$tok" || fail "the checkpoint's tokenizer is not the one trained with"
    # A tokenizer given on resume must be the one trained with, by content.
    { cat "$tok"; echo; } > tok-edited.json
    expect_error "is not the one the checkpoint ft-half trained with" "$lm" train --data corpus2.txt --resume ft-half \
      --tokenizer tok-edited.json
    # Bad input is named.
    expect_error "--preset needs --tokenizer" "$lm" train --preset tiny --data corpus.txt
    expect_error "give one of --init PATH (fine-tune), --preset NAME" "$lm" train --init hf --preset tiny --data corpus.txt
    # A llama2.c file (legacy header, zero weights) of a shape no preset has
    # loads (the Llama family's Dynamic model); then its missing tokenizer is named.
    { printf '\x08\0\0\0\x10\0\0\0\x01\0\0\0\x02\0\0\0\x02\0\0\0\x04\0\0\0\x04\0\0\0'; head -c 2848 /dev/zero; } > odd.bin
    expect_error "no tokenizer here" "$lm" eval --model odd.bin --data corpus.txt
    expect_error "no tokenizer here" "$lm" eval --model pre --tokenizer . --data corpus.txt
    expect_error "--prompt is" "$lm" sample --model ft --prompt "$(head -c 200 corpus.txt)"
    # Weights that overflow the logits (finite, 3e38): an error, not "nan" or noise with status 0.
    rm -rf big && cp -r hf big && python3 -c "
import json, struct
b = bytearray(open('big/model.safetensors', 'rb').read())
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
s, e = h['wte.weight']['data_offsets']
b[8 + n + s:8 + n + e] = struct.pack('<f', 3e38) * ((e - s) // 4)
open('big/model.safetensors', 'wb').write(b)"
    expect_error "the model's logits are not finite numbers" "$lm" eval --model big --data corpus.txt --context 16
    expect_error "the model's logits are not finite numbers" "$lm" sample --model big --prompt "one" --tokens 4
    ;;
  charlm_old_checkpoint)
    # A checkpoint written before checkpoints recorded their architecture
    # (its preset's name only) samples what the build that wrote it sampled.
    old=$here/../reference/fixtures/charlm_8f238f5
    "$charlm" sample --checkpoint "$old" --prompt "the " --tokens 40 --temperature 0 > old.txt 2> /dev/null ||
      fail "sample --checkpoint of the old checkpoint failed"
    cmp -s old.txt "$old/greedy.txt" || fail "the old checkpoint samples '$(cat old.txt)', not '$(cat "$old/greedy.txt")'"
    ;;
  lm_families)
    # A checkpoint of each published family in a shape no preset has
    # (reference/families.py): xfmr-lm samples and evaluates it as it is,
    # and a Qwen2-shaped one fine-tunes, resumes bit for bit and exports
    # back to Qwen2's layout, which loads again with the same loss.
    tok=$here/../reference/fixtures/lm/tokenizer.json
    fam=$here/../reference/fixtures/families
    make_corpus
    for f in gpt2-ctx2048 llama3-scaled qwen2 smollm2; do
      "$lm" sample --model "$fam/$f" --tokenizer "$tok" --prompt "Once" --tokens 12 --temperature 0 > "$f.txt" \
        2> "$f.err" || fail "sample --model $f failed: $(cat "$f.err")"
      grep -q "^Once" "$f.txt" || fail "sample --model $f lost its prompt: $(cat "$f.txt")"
      "$lm" eval --model "$fam/$f" --tokenizer "$tok" --data corpus.txt --context 16 > "$f.eval" \
        || fail "eval --model $f failed"
    done
    tune() { "$lm" train --init "$fam/qwen2" --tokenizer "$tok" --data corpus.txt --steps 30 --batch 4 --context 16 \
               --lr 1e-3 --eval-every 10 --eval-windows 4 "$@" > /dev/null; }
    tune --out ft || fail "fine-tuning the Qwen2-shaped model failed"
    tune --out half --stop-after 10 || fail "fine-tuning to step 10 failed"
    tune --resume half || fail "resuming the fine-tuning failed"
    same ft half
    "$lm" export --model ft --hf ft-hf > /dev/null || fail "export failed"
    grep -q '"model_type": "qwen2"' ft-hf/config.json || fail "the export is not Qwen2's: $(cat ft-hf/config.json)"
    # LoRA (--lora): adapters on the frozen base train (the loss falls); the
    # checkpoint is the adapters, a peft directory, and the run's state; it
    # resumes bit for bit (LoRA dropout's masks too) and decodes through
    # sample --lora (no mask drawn), not alone.
    lora_tune() { "$lm" train --init "$fam/qwen2" --tokenizer "$tok" --data corpus.txt --steps 30 --batch 4 \
                    --context 16 --lr 1e-2 --eval-every 10 --eval-windows 4 "$@" > /dev/null; }
    lora=(--lora r=4,alpha=8,targets=q,k,v,o,gate,up,down,dropout=0.05)  # (the resume replays its masks)
    lora_tune "${lora[@]}" --out lora --metrics-json lora.json || fail "LoRA fine-tuning failed"
    start=$(json_value lora.json start_val_loss) end=$(json_value lora.json val_loss)
    awk -v s="$start" -v e="$end" 'BEGIN { exit !(e < s - 0.05) }' || fail "LoRA went from $start to $end"
    for f in adapter_config.json adapter_model.safetensors; do [[ -f lora/$f ]] || fail "no lora/$f: $(ls lora)"; done
    # On a bf16 base (--precision bf16: the base held as bf16 copies) the loss falls too.
    lora_tune "${lora[@]}" --precision bf16 --out lora-bf16 --metrics-json lora-bf16.json ||
      fail "LoRA on a bf16 base failed"
    start=$(json_value lora-bf16.json start_val_loss) end=$(json_value lora-bf16.json val_loss)
    awk -v s="$start" -v e="$end" 'BEGIN { exit !(e < s - 0.05) }' || fail "LoRA on bf16 went from $start to $end"
    # On an int8 or 4-bit base (the forward through its int8 or 4-bit copies) too.
    for p in int8 q4; do
      lora_tune "${lora[@]}" --precision $p --out lora-$p --metrics-json lora-$p.json || fail "LoRA on a $p base failed"
      start=$(json_value lora-$p.json start_val_loss) end=$(json_value lora-$p.json val_loss)
      awk -v s="$start" -v e="$end" 'BEGIN { exit !(e < s - 0.05) }' || fail "LoRA on $p went from $start to $end"
    done
    # On a 4-bit checkpoint (its panels read in place), and its adapter decodes on it.
    "$lm" quantise --model "$fam/qwen2" --tokenizer "$tok" --out q4base --precision q4 > /dev/null || fail "quantise failed"
    "$lm" train --init q4base --tokenizer "$tok" --data corpus.txt --steps 30 --batch 4 --context 16 --lr 1e-2 \
      --eval-every 10 --eval-windows 4 --lora r=4,alpha=8 --precision q4 --out lora-q4ckpt \
      --metrics-json lora-q4ckpt.json > /dev/null || fail "LoRA on a 4-bit checkpoint failed"
    start=$(json_value lora-q4ckpt.json start_val_loss) end=$(json_value lora-q4ckpt.json val_loss)
    awk -v s="$start" -v e="$end" 'BEGIN { exit !(e < s - 0.05) }' || fail "LoRA on q4base went from $start to $end"
    "$lm" sample --model q4base --lora lora-q4ckpt --prompt Once --tokens 4 --temperature 0 > /dev/null 2>&1 ||
      fail "sample --lora on the 4-bit checkpoint failed"
    lora_tune "${lora[@]}" --out lora-half --stop-after 10 || fail "LoRA to step 10 failed"
    lora_tune --resume lora-half || fail "resuming the LoRA run failed"
    same lora lora-half
    "$lm" sample --model "$fam/qwen2" --tokenizer "$tok" --lora lora --prompt Once --tokens 8 --temperature 0 \
      > lora.txt 2> /dev/null || fail "sample --lora failed"
    grep -q "^Once" lora.txt || fail "sample --lora lost its prompt: $(cat lora.txt)"
    # Merged into the base and exported, the model samples what base + adapter sampled.
    "$lm" export --model "$fam/qwen2" --tokenizer "$tok" --lora lora --hf merged > /dev/null || fail "export --lora failed"
    "$lm" sample --model merged --prompt Once --tokens 8 --temperature 0 > merged.txt 2> /dev/null ||
      fail "sampling the merged export failed"
    cmp -s lora.txt merged.txt || fail "the merged export samples '$(cat merged.txt)', base + adapter '$(cat lora.txt)'"
    expect_error "qwen2 with them as its adapter" "$lm" sample --model lora --tokens 4
    expect_error "--lora trains adapters on --init's model" "$lm" train --preset tiny --tokenizer "$tok" \
      --data corpus.txt --lora r=2
    expect_error "LoRA setting 'rank=x'" "$lm" train --init "$fam/qwen2" --tokenizer "$tok" --data corpus.txt --lora rank=x
    "$lm" eval --model ft --data corpus.txt --context 16 > ft.eval || fail "eval of the fine-tuned model failed"
    "$lm" eval --model ft-hf --tokenizer "$tok" --data corpus.txt --context 16 > ft-hf.eval || fail "eval of the export failed"
    [ "$(grep -o 'loss [0-9.]*' ft.eval)" = "$(grep -o 'loss [0-9.]*' ft-hf.eval)" ] ||
      fail "the export's loss differs: $(cat ft.eval) / $(cat ft-hf.eval)"
    # An architecture no published family has (post-norm blocks, GeGLU,
    # sinusoidal positions) from a JSON file: trained 10 steps, stopped and
    # resumed bit for bit, sampled from its checkpoint.
    cat > arch.json <<'JSON'
{"name": "post-geglu", "dropout": 0.0, "parts": {"pre_norm": false, "rms_norm": false, "activation": "geglu", "positions": "sinusoidal"},
 "dims": {"max_t": 32, "d_model": 32, "n_heads": 2, "n_kv_heads": 2, "n_layers": 2, "d_ff": 48, "qk_head_dim": 0,
          "v_head_dim": 0, "norm_eps": 1e-5, "rope_theta": 10000.0, "bias": true, "qkv_bias": false,
          "rope_scaling": {"kind": "none", "factor": 1.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_t": 8192}}}
JSON
    arch() { "$lm" train --architecture arch.json --tokenizer "$tok" --data corpus.txt --steps 10 --batch 4 \
               --context 16 --lr 3e-3 --eval-every 5 --eval-windows 4 "$@" > /dev/null; }
    arch --out pg || fail "training the post-norm GeGLU model failed"
    arch --out pg-half --stop-after 5 || fail "training it to step 5 failed"
    "$lm" train --data corpus.txt --resume pg-half > /dev/null || fail "resuming it failed"
    same pg pg-half
    "$lm" sample --model pg --prompt "the cat" --tokens 8 --temperature 0 > pg.txt 2> pg.err ||
      fail "sampling it failed: $(cat pg.err)"
    grep -q "post-geglu" pg.err || fail "the sample does not name its architecture: $(cat pg.err)"
    expect_error "give one of --init PATH (fine-tune), --preset NAME or --architecture FILE" "$lm" train \
      --architecture arch.json --preset tiny --tokenizer "$tok" --data corpus.txt
    # export --gguf: a Llama- or GPT-2-shaped model only, a known type, never over a file unasked.
    expect_error "unknown --type 'q5_1' (f32, f16, bf16, q8_0 or q4_0)" "$lm" export --model pg --gguf pg.gguf --type q5_1
    expect_error "is not Llama-shaped" "$lm" export --model pg --gguf pg.gguf
    touch taken.gguf
    expect_error "--gguf taken.gguf exists already (--overwrite replaces it)" "$lm" export --model ft --gguf taken.gguf
    # llama.cpp's stories260K GGUF (../shared/DATA.md), where the data is:
    # llama.cpp's greedy text from BOS, its tokenizer read from the file.
    gguf=$here/../../../shared/data/gguf/stories260K.gguf
    if [[ -f $gguf ]]; then
      out=$("$lm" sample --model "$gguf" --temperature 0 --tokens 64 2> gguf.err) || fail "stories260K: $(cat gguf.err)"
      [[ $out == "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. She wanted to play with it, but it was too high."* ]] ||
        fail "stories260K.gguf's greedy text: $out"
    else
      echo "skipped the GGUF check: no $gguf"
    fi
    ;;
  lm_export_pytorch)
    # A model xfmr-lm trained and exported, read by plain PyTorch
    # (lm_loss.py, float64): the same loss on the same windows, to 1e-4.
    python=${XFMR_PYTHON:-/usr/bin/python3}
    "$python" -c "import torch" 2>/dev/null || { echo "skipped: no python3-torch"; exit 77; }
    make_corpus
    "$lm" train --preset tiny --tokenizer "$here/../reference/fixtures/lm/tokenizer.json" --data corpus.txt --steps 100 \
      --batch 8 --lr 3e-3 --eval-every 50 --out pre --log-csv pre.csv --report pre.html > /dev/null || fail "training failed"
    "$lm" export --model pre --hf hf > /dev/null || fail "export failed"
    ours=$("$lm" eval --model hf --data corpus.txt --context 16 --windows 128 | cut -d' ' -f2)
    theirs=$(cd "$here/../reference" && "$python" lm_loss.py "$work/hf" "$work/corpus.txt" 16 128) || fail "lm_loss.py failed"
    awk -v a="$ours" -v b="$theirs" 'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }' ||
      fail "xfmr's loss $ours, PyTorch's $theirs"
    echo "xfmr $ours, PyTorch $theirs"
    ;;
  *) fail "unknown case $case_name" ;;
esac
echo "ok: $case_name"
