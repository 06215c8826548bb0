#!/usr/bin/env bash
# KV shared with the weights (issue 30): configs/opt-seeded.json (four 192 MiB emulated devices,
# three OPT-125M TP2 x PP2, two resident at once), the hot model a driven by a closed loop
# of 8 long sequences (prompt 64, 448 generated: 32 KV blocks each per shard) while b sits
# resident and idle. Shared budget (scheduler.kv_reserve_mb 0): a's KV takes the free room
# and then b's, evicted. Fixed reserve (kv_reserve_mb 16, vLLM's way): a's KV never
# exceeds 16 MiB per device, so about three sequences fit and the rest wait or are
# preempted. Each on a fresh server, in one run; prints loadgen's summary of each and the
# ratio of output tokens/s.
#   bench/kv_shared.sh [PROMPTS]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/apps/computron/computron"
prompts=${1:-16}
port=18791
dir=$(mktemp -d)
pid=
# KEEP=1 keeps the logs and summaries (the path goes to stderr).
trap 'kill "$pid" 2>/dev/null || true; if [ -n "${KEEP:-}" ]; then echo "kept $dir" >&2; else rm -rf "$dir"; fi' EXIT
run() {  # RESERVE_MB: prints output tokens/s
  sed "s/\"kv_in_ledger\": true/\"kv_in_ledger\": true, \"kv_reserve_mb\": $1/; s/\"port\": 8000/\"port\": $port/" \
    "$root/configs/opt-seeded.json" >"$dir/config.json"
  grep -q "\"kv_reserve_mb\": $1" "$dir/config.json"  # the setting took
  "$bin" serve --config "$dir/config.json" >"$dir/serve-$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    curl -sf "localhost:$port/v2/health/ready" >/dev/null 2>&1 && break
    sleep 1
  done
  # b, then a: both resident, a the most recent.
  for m in opt-125m-b opt-125m-a; do
    curl -sf "localhost:$port/v1/completions" -H 'content-type: application/json' \
      -d "{\"model\": \"$m\", \"prompt\": [2, 7, 300, 44], \"max_tokens\": 2}" >/dev/null
  done
  "$bin" loadgen --url "http://127.0.0.1:$port" --models opt-125m-a --num-prompts "$prompts" \
    --max-concurrency 8 --prompt-len 64 --max-tokens 448 --api completions --no-progress \
    --json >"$dir/summary-$1.json" 2>"$dir/loadgen-$1.log" || true
  curl -s "localhost:$port/metrics" | grep -E '^computron_(preemptions_total|shard_evictions_total)' \
    >"$dir/metrics-$1.txt" || true
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  python3 - "$dir/summary-$1.json" "$dir/metrics-$1.txt" "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
m = open(sys.argv[2]).read().split("\n")
pre = sum(float(l.split()[-1]) for l in m if l.startswith("computron_preemptions_total"))
ev = sum(float(l.split()[-1]) for l in m if l.startswith("computron_shard_evictions_total"))
print(f"kv_reserve_mb {sys.argv[3]}: completed {s['completed']}, failed {s.get('failed', 0)}, "
      f"output tokens/s {s['output_throughput']:.1f}, p99 TTFT {s['p99_ttft_ms']:.0f} ms, "
      f"mean TPOT {s['mean_tpot_ms']:.1f} ms, preemptions {pre:.0f}, shard evictions {ev:.0f}")
PY
}
shared=$(run 0)
echo "$shared"
fixed=$(run 16)
echo "$fixed"
python3 -c "
import re, sys
a = float(re.search(r'output tokens/s ([0-9.]+)', sys.argv[1]).group(1))
b = float(re.search(r'output tokens/s ([0-9.]+)', sys.argv[2]).group(1))
print(f'shared / fixed reserve output tokens/s: {a / b:.2f}x')" "$shared" "$fixed"
