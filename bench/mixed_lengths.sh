#!/usr/bin/env bash
# Continuous against static batching on a mixed-length open-loop workload (issue 30):
# configs/opt-seeded.json (three OPT-125M TP2 x PP2 on four emulated devices), model a only,
# prompts and outputs lognormal around 64 tokens (CV 0.5), Poisson arrivals. First the
# static server's capacity (a closed loop of 16), then both servers at 80% of it, each on
# a fresh server, in one run: output tokens/s and p99 TTFT of each.
#   bench/mixed_lengths.sh [SECONDS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/apps/computron/computron"
secs=${1:-40}
port=18795
dir=$(mktemp -d)
pid=
trap 'kill "$pid" 2>/dev/null || true; if [ -n "${KEEP:-}" ]; then echo "kept $dir" >&2; else rm -rf "$dir"; fi' EXIT
lengths=(--prompt-len 64 --max-tokens 64 --prompt-dist lognormal:0.5 --output-dist lognormal:0.5)
start() {  # CONTINUOUS
  sed "s/\"continuous\": true/\"continuous\": $1/; s/\"port\": 8000/\"port\": $port/" \
    "$root/configs/opt-seeded.json" >"$dir/config.json"
  grep -q "\"continuous\": $1" "$dir/config.json"  # the toggle took
  "$bin" serve --config "$dir/config.json" >"$dir/serve-$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    curl -sf "localhost:$port/v2/health/ready" >/dev/null 2>&1 && break
    sleep 1
  done
  curl -sf "localhost:$port/v1/completions" -H 'content-type: application/json' \
    -d '{"model": "opt-125m-a", "prompt": [2, 7, 300, 44], "max_tokens": 2}' >/dev/null
}
stop() {
  kill "$pid"
  wait "$pid" 2>/dev/null || true
}
show() {  # LABEL SUMMARY
  python3 - "$1" "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[2]))
print(f"{sys.argv[1]}: completed {s['completed']}, failed {s.get('failed', 0)}, "
      f"req/s {s['request_throughput']:.2f}, output tok/s {s['output_throughput']:.1f}, "
      f"p99 TTFT {s['p99_ttft_ms']:.0f} ms, median TTFT {s['median_ttft_ms']:.0f} ms, "
      f"mean TPOT {s['mean_tpot_ms']:.1f} ms")
PY
}
start false
"$bin" loadgen --url "http://127.0.0.1:$port" --models opt-125m-a --num-prompts 48 \
  --max-concurrency 16 "${lengths[@]}" --api completions --no-progress --json \
  >"$dir/capacity.json" 2>"$dir/capacity.log" || true
stop
show "static, closed loop of 16 (capacity)" "$dir/capacity.json"
rate=$(python3 -c "import json; print(round(0.8 * json.load(open('$dir/capacity.json'))['request_throughput'], 3))")
echo "open loop at 80% of that: $rate requests/s for $secs s"
for continuous in false true; do
  start "$continuous"
  "$bin" loadgen --url "http://127.0.0.1:$port" --models opt-125m-a --rates "$rate" \
    --duration "$secs" "${lengths[@]}" --api completions --no-progress --json \
    >"$dir/open-$continuous.json" 2>"$dir/open-$continuous.log" || true
  stop
  show "continuous $continuous, open loop" "$dir/open-$continuous.json"
done
python3 - "$dir/open-false.json" "$dir/open-true.json" <<'PY'
import json, sys
st, co = (json.load(open(p)) for p in sys.argv[1:3])
print(f"continuous / static: output tok/s {co['output_throughput'] / st['output_throughput']:.2f}x, "
      f"p99 TTFT {co['p99_ttft_ms'] / st['p99_ttft_ms']:.2f}x")
PY
