#!/usr/bin/env bash
# Two builds give the same completions (issue 33: the vocabulary-parallel layout changes no
# output): each binary serves configs/opt-seeded.json's three OPT-125M models (bf16, TP2 x PP2,
# seeds 1-3; the devices as large as the OLD build needs) and answers the same five
# /v1/completions requests (greedy, temperature with top_p, top_k, n = 2, logprobs); the
# texts and log-probabilities are compared.
#   bench/same_outputs.sh OLD_BINARY [NEW_BINARY]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
old=${1:?usage: bench/same_outputs.sh OLD_BINARY [NEW_BINARY]}
new=${2:-$root/build/apps/computron/computron}
dir=$(mktemp -d)
pid=
trap 'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi; rm -rf "$dir"' EXIT

answers() {  # BINARY PORT OUT
  python3 - "$2" "$root/configs/opt-seeded.json" >"$dir/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[2]))
c["http"]["port"] = int(sys.argv[1])
c["devices"]["capacity_mb"] = 256  # two models' shards fit in both layouts
print(json.dumps(c))
PY
  "$1" serve --config "$dir/config.json" >"$dir/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    curl -sf "localhost:$2/v2/health/ready" >/dev/null 2>&1 && break
    sleep 1
  done
  : >"$3"
  for body in \
    '{"model":"opt-125m-a","prompt":"The quick brown fox","max_tokens":24,"temperature":0}' \
    '{"model":"opt-125m-b","prompt":"Once upon a time","max_tokens":24,"temperature":0.9,"top_p":0.95,"seed":7}' \
    '{"model":"opt-125m-c","prompt":"In the beginning","max_tokens":24,"temperature":1.0,"top_k":40,"seed":3}' \
    '{"model":"opt-125m-a","prompt":["A","B c d e"],"max_tokens":16,"temperature":0.7,"seed":11,"n":2}' \
    '{"model":"opt-125m-b","prompt":"Hello","max_tokens":8,"temperature":0,"logprobs":2}'; do
    curl -s "localhost:$2/v1/completions" -H 'content-type: application/json' -d "$body" |
      python3 -c 'import json, sys
j = json.load(sys.stdin)
print(json.dumps([(c["text"], (c.get("logprobs") or {}).get("token_logprobs")) for c in j["choices"]]))' \
        >>"$3"
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
}

answers "$old" 18791 "$dir/old.txt"
answers "$new" 18792 "$dir/new.txt"
if diff "$dir/old.txt" "$dir/new.txt"; then
  echo "same outputs: $(wc -l <"$dir/new.txt") requests, texts and log-probabilities equal"
else
  echo "outputs differ"
  exit 1
fi
