#!/usr/bin/env bash
# n samples of one prompt share its prefill (issue 29): one /v1/completions request with
# n = 8 against one with 8 distinct prompts of the same length, on a seeded qwen2.5-0.5b
# (f32, emulated device), max_tokens 1 so the prefill is the work; both timed in one run.
#   bench/shared_prefill.sh [ROUNDS] [PROMPT_TOKENS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/apps/computron/computron"
rounds=${1:-2}
len=${2:-256}
port=18777
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
cat >"$dir/config.json" <<JSON
{"devices": {"kind": "emulated", "count": 1, "capacity_mb": 6000, "link_gbps": 16},
 "http": {"host": "127.0.0.1", "port": $port},
 "batching": {"max_batch_size": 8, "batch_window_ms": 5, "max_tokens": 64},
 "models": [{"name": "q", "kind": "llama", "spec": "qwen2.5-0.5b", "dtype": "f32",
             "tokenizer": "bytes", "devices": [0]}]}
JSON
"$bin" serve --config "$dir/config.json" >"$dir/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do
  curl -sf "localhost:$port/v2/health/ready" >/dev/null 2>&1 && break
  sleep 1
done
ids() {  # LEN ids starting with $1 (ids 4..203: the byte tokenizer's range)
  local first=$1 out=$1
  for i in $(seq 2 "$len"); do out="$out,$(((i * 37) % 200 + 4))"; done
  echo "$out"
}
post() {
  local t0 t1
  t0=$(date +%s.%N)
  curl -sf "localhost:$port/v1/completions" -d "$1" >/dev/null
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }' 
}
post '{"model": "q", "prompt": [5, 6, 7], "max_tokens": 1}' >/dev/null  # the load
one=$(ids 4)
distinct="[$one]"
for k in 1 2 3 4 5 6 7; do distinct="$distinct,[$(ids $((4 + k)))]"; done
for r in $(seq 1 "$rounds"); do
  shared=$(post "{\"model\": \"q\", \"prompt\": [$one], \"n\": 8, \"max_tokens\": 1, \"seed\": 1}")
  apart=$(post "{\"model\": \"q\", \"prompt\": [$distinct], \"max_tokens\": 1, \"seed\": 1}")
  echo "round $r: n=8 shared ${shared}s, 8 distinct prompts ${apart}s, ratio $(awk -v a="$apart" -v s="$shared" 'BEGIN { printf "%.2f", a / s }')x"
done
