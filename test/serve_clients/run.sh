#!/usr/bin/env bash
# Real clients against xfmr-serve (ctest: serve_openai_client, serve_chat_page):
#   run.sh openai|page XFMR_SERVE MODEL TOKENIZER WORK_DIR
# Installs the locked npm packages (npm ci) in WORK_DIR, starts the server on
# a free port, runs the client, and stops the server with SIGTERM (exit 0
# expected). Exit 77 (skipped) without Node, npm or Chromium, or when npm
# ci fails and the npm registry does not answer (a failure when it does).
set -euo pipefail
what=$1 serve=$2 model=$3 tokenizer=$4 work=$5
here=$(cd "$(dirname "$0")" && pwd)
command -v node > /dev/null && command -v npm > /dev/null || { echo "no node/npm: skipped"; exit 77; }
[[ $what != page || -x ${CHROMIUM:-/usr/bin/chromium} ]] || { echo "no chromium: skipped"; exit 77; }
rm -rf "$work" && mkdir -p "$work" && cp "$here/package.json" "$here/package-lock.json" "$here"/*.mjs "$work/"
cd "$work"
if ! npm ci --no-audit --no-fund > npm.log 2>&1; then
  cat npm.log
  npm ping > /dev/null 2>&1 && { echo "npm ci failed with the registry answering"; exit 1; }
  echo "npm ci failed and the npm registry does not answer: skipped"
  exit 77
fi
key=serve-test-key
args=(--model "$model" --tokenizer "$tokenizer" --port 0 --slots 4)
[[ $what == openai ]] && args+=(--api-key "$key" --context 1024) || args+=(--context 2048)
"$serve" "${args[@]}" 2> serve.log &
pid=$!
trap 'kill $pid 2> /dev/null || true' EXIT
port=""
for _ in $(seq 600); do
  port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\)/.*|\1|p' serve.log)
  [[ -n $port ]] && curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  kill -0 $pid 2> /dev/null || { cat serve.log; exit 1; }
  sleep 0.1
done
url="http://127.0.0.1:$port"
case $what in
  openai)
    node openai_client.mjs "$url" "$key"
    # curl -N streams the same server-sent events.
    curl -sfN "$url/v1/chat/completions" -H "Authorization: Bearer $key" \
      -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": true}' > curl.txt
    grep -q '^data: \[DONE\]$' curl.txt || { echo "curl -N: no [DONE]"; cat curl.txt; exit 1; }
    echo "curl -N: $(grep -c '^data: ' curl.txt) events"
    # ... with two choices and logprobs: events of index 1, each token's logprobs.
    curl -sfN "$url/v1/completions" -H "Authorization: Bearer $key" \
      -d '{"prompt": "Hi", "max_tokens": 4, "n": 2, "logprobs": 1, "stream": true}' > curl_n.txt
    grep -q '"index":1' curl_n.txt && grep -q '"token_logprobs":\[' curl_n.txt ||
      { echo "curl -N: no second choice or no logprobs"; cat curl_n.txt; exit 1; }
    echo "curl -N, n 2 with logprobs: $(grep -c '"token_logprobs"' curl_n.txt) token events"
    ;;
  page) node chat_page.mjs "$url/?temperature=0" "$work/chat_page.png" ;;  # greedy: the same answers every run
esac
kill -TERM $pid
status=0
wait $pid || status=$?
trap - EXIT
[[ $status == 0 ]] || { echo "xfmr-serve exited $status after SIGTERM"; cat serve.log; exit 1; }
echo "xfmr-serve stopped with status 0"
