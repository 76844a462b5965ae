#!/usr/bin/env bash
# xfmr-serve's signals, for one copy of the program (the build tree's, or
# the one `cmake --install` put in a prefix: test/consumer):
#   serve_signals.sh XFMR_SERVE MODEL TOKENIZER WORK_DIR
# SIGTERM, and SIGINT to a script's background job (which inherits SIGINT
# ignored), each drain: the server says so, a stream decoding when the
# signal came is finished whole, and the status is 0. A second signal cuts
# a stream: an error event, not a finish reason. --host ::1 prints a URL
# that works; an empty --api-key and a model that does not load exit 1.
set -euo pipefail
serve=$(realpath "$1") model=$(realpath "$2") tokenizer=$(realpath "$3") work=$4
rm -rf "$work" && mkdir -p "$work" && cd "$work"
fail() { echo "serve_signals: $*" >&2; exit 1; }

# start LOG [options...]: a server in the background ($pid), listening ($url).
start() {
  local log=$1
  shift
  "$serve" --model "$model" --tokenizer "$tokenizer" --port 0 --context 2048 "$@" 2> "$log" &
  pid=$!
  url=
  for _ in $(seq 600); do
    url=$(grep -o 'listening on http://[^ ]*/' "$log" | sed 's/listening on //; s#/$##' || true)
    [[ -n $url ]] && curl -sf "$url/health" > /dev/null && return
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.05
  done
  fail "the server did not start: $(cat "$log")"
}
# stream FILE TOKENS: a streamed completion decoding in the background ($client); returns once it has begun.
stream() {
  curl -sN "$url/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"The cat\", \"max_tokens\": $2, \"ignore_eos\": true, \"stream\": true, \"temperature\": 0}" > "$1" &
  client=$!
  for _ in $(seq 400); do
    grep -q '^data: {' "$1" 2> /dev/null && return
    sleep 0.025
  done
  fail "the stream did not begin"
}

for sig in TERM INT; do
  start "$sig.log"
  stream "$sig.stream" 400
  kill -"$sig" "$pid"
  status=0 && wait "$pid" || status=$?
  wait "$client" || true
  [[ $status == 0 ]] || fail "SIG$sig: exit status $status; $(cat "$sig.log")"
  grep -q "SIG$sig: finishing the running requests" "$sig.log" || fail "SIG$sig: no drain: $(cat "$sig.log")"
  grep -q '"finish_reason":"length"' "$sig.stream" || fail "SIG$sig: the running stream was not finished"
  grep -q '^data: \[DONE\]' "$sig.stream" || fail "SIG$sig: no [DONE]"
  echo "SIG$sig: drained, status 0"
done

# A second signal (or the drain's deadline) cuts what runs: reported as cut.
# Tried until both requests were still decoding when the signals went (a
# random model's 2000 tokens take a fraction of a second).
cut_tried() {
  start cut.log --drain 30
  stream cut.stream 2000
  curl -s -o whole.json -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "The cat", "max_tokens": 2000, "ignore_eos": true, "temperature": 0}' > whole.status &
  whole=$!
  local metrics=
  for _ in $(seq 400); do  # until the engine holds both requests
    metrics=$(curl -s "$url/metrics")
    grep -q '^xfmr_requests_total 2$' <<< "$metrics" && break
    sleep 0.01
  done
  kill -TERM "$pid" && kill -INT "$pid"  # two signals (of one kind they could merge)
  status=0 && wait "$pid" || status=$?
  wait "$client" "$whole" || true
  [[ $status == 0 ]] || fail "cut: exit status $status"
  grep -q '^xfmr_requests_total 2$' <<< "$metrics" && grep -q '^xfmr_requests_finished_total 0$' <<< "$metrics"
}
for try in 1 2 3 4 5 6; do
  cut_tried && break
  [[ $try == 6 ]] && fail "cut: the requests finished before the signals, six times"
done
grep -q '"error":.*cut after' cut.stream || fail "cut: no error event: $(tail -c 400 cut.stream)"
! grep -q '"finish_reason":"\(stop\|length\)"' cut.stream || fail "cut: a cut stream said it finished"
[[ $(cat whole.status) == 503 ]] && grep -q 'cut after' whole.json ||
  fail "cut: a whole answer was $(cat whole.status) $(cat whole.json)"
echo "a second signal: the stream ends with an error event, a whole answer is a 503 (try $try)"

start v6.log --host ::1
[[ $url == http://\[::1\]:* ]] || fail "--host ::1 printed $url"
kill -TERM "$pid" && wait "$pid"
echo "--host ::1: $url"

for key in "" "  "; do
  status=0 && "$serve" --model "$model" --tokenizer "$tokenizer" --api-key "$key" 2> key.log || status=$?
  [[ $status == 1 ]] && grep -q -- "--api-key is empty" key.log || fail "--api-key '$key': status $status, $(cat key.log)"
done
echo "an empty --api-key: refused"
# Speculative decoding from two sources, or a draft's option without a draft.
for opts in "--lookup 2 --draft $model" "--draft-tokens 2"; do
  status=0 && "$serve" --model "$model" --tokenizer "$tokenizer" $opts 2> draft.log || status=$?
  [[ $status == 1 ]] && grep -q -e "from one source" -e "are --draft's" draft.log || fail "$opts: status $status, $(cat draft.log)"
done
echo "--lookup with --draft, --draft-tokens alone: refused"

# A model that does not load ends the server with status 1, every time.
for i in 1 2 3 4 5; do
  status=0 && timeout 60 "$serve" --model "$tokenizer" --port 0 2> bad.log || status=$?
  [[ $status == 1 ]] || fail "a model that does not load: status $status (run $i); $(cat bad.log)"
done
echo "a model that does not load: status 1, five of five"
