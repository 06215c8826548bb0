#!/usr/bin/env bash
# Continuous batching (issue 30): on configs/opt-seeded.json (three OPT-125M, TP2 x PP2, emulated),
# a short request (4 tokens) sent 0.6 s after two long ones (128 tokens, 0.3 s apart)
# against the same short request alone; with batching.continuous on and off, each on a
# fresh server, in one run. Prints the short request's times and their ratio.
#   bench/continuous.sh [ROUNDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/apps/computron/computron"
rounds=${1:-3}
port=18781
dir=$(mktemp -d)
pid=
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
post() {  # BODY: prints the seconds the request took
  local t0 t1
  t0=$(date +%s.%N)
  curl -sf "localhost:$port/v1/completions" -H 'content-type: application/json' -d "$1" >/dev/null
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'
}
long='{"model": "opt-125m-a", "prompt": [2, 100, 37, 5, 400, 12, 9, 81], "max_tokens": 128, "ignore_eos": true}'
short='{"model": "opt-125m-a", "prompt": [2, 7, 300, 44], "max_tokens": 4, "ignore_eos": true}'
for continuous in true false; do
  sed "s/\"continuous\": true/\"continuous\": $continuous/; s/\"port\": 8000/\"port\": $port/" \
    "$root/configs/opt-seeded.json" >"$dir/config.json"
  grep -q "\"continuous\": $continuous" "$dir/config.json"  # the toggle took
  "$bin" serve --config "$dir/config.json" >"$dir/serve-$continuous.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    curl -sf "localhost:$port/v2/health/ready" >/dev/null 2>&1 && break
    sleep 1
  done
  post "$short" >/dev/null  # the load, and a first run of every step's code
  for r in $(seq 1 "$rounds"); do
    alone=$(post "$short")
    post "$long" >"$dir/a" &
    a=$!
    sleep 0.3
    post "$long" >"$dir/b" &
    b=$!
    sleep 0.3
    behind=$(post "$short")
    wait "$a" "$b"
    echo "continuous $continuous, round $r: short alone ${alone}s, behind two long ${behind}s ($(awk -v x="$behind" -v y="$alone" 'BEGIN { printf "%.1f", x / y }')x); long $(cat "$dir/a")s, $(cat "$dir/b")s"
  done
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done
