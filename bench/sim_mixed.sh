#!/usr/bin/env bash
# The simulator against the runtime on the mixed-length workload (issue 30): serve's
# defaults (three OPT-125M TP2 x PP2, emulated), model a only, prompts and outputs
# lognormal around 64 tokens (CV 0.5), Poisson arrivals at RATE for SECONDS; then
# `computron sim` with the same config, flags and seed, calibrated from the server it
# just measured (its link efficiency, eviction time and mean step time). Prints both
# runs' throughput and latency and the simulator's error on each.
#   bench/sim_mixed.sh [SECONDS] [RATE] [CHUNK]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/apps/computron/computron"
secs=${1:-30}
rate=${2:-2}
chunk=${3:-512}
port=18799
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_scratch
flags=(--models opt-125m-a --rates "$rate" --duration "$secs" --seed 3 --prompt-len 64
  --max-tokens 64 --prompt-dist lognormal:0.5 --output-dist lognormal:0.5)
serve_start runtime "s/\"prefill_chunk\": 512/\"prefill_chunk\": $chunk/"
curl -sf "localhost:$port/v1/completions" -H 'content-type: application/json' \
  -d '{"model": "opt-125m-a", "prompt": [2, 7, 300, 44], "max_tokens": 2}' >/dev/null
"$bin" loadgen --url "http://127.0.0.1:$port" "${flags[@]}" --api completions --no-progress \
  --json >"$dir/runtime.json" 2>"$dir/runtime.log" || true
"$bin" sim --config "$dir/config-runtime.json" "${flags[@]}" --warm-up \
  --calibrate "http://127.0.0.1:$port" --json >"$dir/sim.json" 2>"$dir/sim.log" || true
serve_stop
python3 - "$dir/runtime.json" "$dir/sim.json" <<'PY'
import json, sys
rt, sm = (json.load(open(p)) for p in sys.argv[1:3])
o = sm["overall"]
rows = [("completed", rt["completed"], o["ok"]),
        ("requests/s", rt["request_throughput"], o["throughput_rps"]),
        ("mean latency s", rt["mean_e2el_ms"] / 1e3, o["mean_s"]),
        ("median latency s", rt["median_e2el_ms"] / 1e3, o["p50_s"]),
        ("p99 latency s", rt["p99_e2el_ms"] / 1e3, o["p99_s"])]
print(f"calibration: step {sm.get('measured_step_s')} s + {sm.get('measured_step_per_token_s')} s per token")
print(f"{'':18} {'runtime':>10} {'simulator':>10} {'sim error':>10}")
for name, r, s in rows:
    err = 100 * (s - r) / r if r else 0
    print(f"{name:18} {r:10.3f} {s:10.3f} {err:9.1f}%")
PY
