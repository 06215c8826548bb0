#!/usr/bin/env bash
# Gpu-lets against time sharing (issue 31), in the simulator and on the emulated runtime:
# two emulated devices, six toy models with skewed steps, rates and SLOs (on each device
# one heavy model, 80 ms steps and a 2 s SLO, and two light ones, 5 ms steps and a 60 ms
# SLO), at base rates 2,2,4,2,4,2 requests/s times each SCALE. For each of temporal (no
# gpu-lets), auto (the planner re-plans every 2 s) and, in the simulator, a fixed 60/40
# split: the share of requests within their model's SLO, and the highest scale at which
# that share is 99% or more. The same configs, flags and seed drive both.
#   bench/gpulets.sh [SECONDS] [SIM_SCALES] [RUNTIME_SCALES]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/apps/computron/computron"
secs=${1:-20}
sim_scales=${2:-"0.25 0.5 1 1.5 2 3 4 6 8"}
rt_scales=${3:-"0.25 0.5 1 2 4 6"}
port=18801
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_scratch
python3 - "$dir" "$port" <<'PY'
import json, sys
d, port = sys.argv[1], int(sys.argv[2])
base = {"devices": {"kind": "emulated", "count": 2, "capacity_mb": 64, "link_gbps": 2.0,
                    "gpulet_replan_ms": 2000},
        "http": {"host": "127.0.0.1", "port": port, "threads": 2},
        "batching": {"max_batch_size": 8, "batch_window_ms": 2, "deadline_ms": 60000},
        "models": []}
for n, dev, ms, slo in [("big0", 0, 80, 2000), ("big1", 1, 80, 2000), ("s0", 0, 5, 60),
                        ("s1", 0, 5, 60), ("s2", 1, 5, 60), ("s3", 1, 5, 60)]:
    base["models"].append({"name": n, "kind": "toy", "devices": [dev], "toy_shard_bytes": 1 << 20,
                           "toy_compute_ms": ms, "slo_ms": slo})
for mode, g in [("temporal", None), ("auto", "auto"), ("static", [[60, 40], [60, 40]])]:
    c = json.loads(json.dumps(base))
    if g is not None:
        c["devices"]["gpulets"] = g
    json.dump(c, open(f"{d}/{mode}.json", "w"), indent=1)
PY
attain() {  # CONFIG REQUESTS_CSV -> "share mean_latency_ms"
  python3 - "$1" "$2" <<'PY'
import csv, json, sys
slo = {m["name"]: m["slo_ms"] / 1e3 for m in json.load(open(sys.argv[1]))["models"]}
rows = list(csv.DictReader(open(sys.argv[2])))
good = sum(r["status"] == "200" and float(r["latency_s"]) <= slo[r["model"]] for r in rows)
lat = [float(r["latency_s"]) for r in rows if r["status"] == "200"]
print(f"{good / max(1, len(rows)):.4f} {1e3 * sum(lat) / max(1, len(lat)):.1f}")
PY
}
rates() { python3 -c "print(','.join(str(x * $1) for x in [2, 2, 4, 2, 4, 2]))"; }
flags() { echo --rates "$(rates "$1")" --duration "$secs" --seed 1; }
echo "simulator (${secs} s of arrivals per cell): within-SLO share, mean latency ms"
for mode in temporal static auto; do
  best=0
  for s in $sim_scales; do
    # shellcheck disable=SC2046
    "$bin" sim --config "$dir/$mode.json" $(flags "$s") --warm-up --report "$dir/sim" --json \
      >/dev/null 2>&1
    read -r share mean <<<"$(attain "$dir/$mode.json" "$dir/sim/requests.csv")"
    echo "sim $mode x$s $share $mean" | tee -a "$dir/sim.txt"
    awk -v a="$share" 'BEGIN { exit !(a >= 0.99) }' && best=$s
  done
  echo "sim $mode: highest scale within 99%: x$best"
done
echo "runtime (computron serve + loadgen, same configs and flags)"
for mode in temporal auto; do
  best=0
  for s in $rt_scales; do
    serve_config "$mode" "$dir/$mode.json"
    for n in big0 big1 s0 s1 s2 s3; do  # one request each, as the simulator's --warm-up
      curl -sf "localhost:$port/v2/models/$n/infer" -H 'content-type: application/json' \
        -d '{"inputs":[{"name":"input_ids","shape":[1,2],"datatype":"INT64","data":[1,2]}]}' \
        >/dev/null
    done
    # shellcheck disable=SC2046
    "$bin" loadgen --url "http://127.0.0.1:$port" $(flags "$s") --no-progress \
      --report "$dir/rt" --json >/dev/null 2>&1 || true
    serve_stop
    read -r share mean <<<"$(attain "$dir/$mode.json" "$dir/rt/requests.csv")"
    sim_line=$(grep "^sim $mode x$s " "$dir/sim.txt" || true)
    echo "runtime $mode x$s $share $mean   | ${sim_line:-sim: not run at this scale}"
    awk -v a="$share" 'BEGIN { exit !(a >= 0.99) }' && best=$s
  done
  echo "runtime $mode: highest scale within 99%: x$best"
done
