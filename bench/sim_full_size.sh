#!/usr/bin/env bash
# The original's experiments at full size in the simulator (no scale factor): OPT-13B of
# 25.7 GB on 4 devices with 32 GB/s links, the a100 cost profile (25 GB/s achieved).
# Prints one line per experiment-1 row and per experiment-2 cell.
# Usage: bench/sim_full_size.sh [path/to/computron] [seconds per exp2 cell]
set -euo pipefail
bin=${1:-build/apps/computron/computron}
duration=${2:-600}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
shard_total=25700000000
echo "Experiment 1 (blocking batches of 4, models alternating; every request swaps)"
printf '%-8s %10s\n' "(TP,PP)" "response s"
for tp_pp in "1 1 40" "2 1 47" "4 1 50" "1 2 49" "1 4 61" "2 2 57"; do
  set -- $tp_pp
  tp=$1 pp=$2 exec_ms=$3 n=$((tp * pp))
  shard=$((shard_total / n / 4096 * 4096))
  devices=$(seq -s, 0 $((n - 1)))
  cat > "$tmp/exp1.json" <<JSON
{"devices": {"kind": "emulated", "count": $n, "capacity_mb": $(python3 -c "print($shard*1.5/1048576)"), "link_gbps": 32.0},
 "batching": {"max_batch_size": 4, "batch_window_ms": 5},
 "models": [
  {"name": "opt-13b-a", "kind": "toy", "tp": $tp, "pp": $pp, "devices": [$devices], "toy_shard_bytes": $shard, "toy_compute_ms": $exec_ms},
  {"name": "opt-13b-b", "kind": "toy", "tp": $tp, "pp": $pp, "devices": [$devices], "seed": 2, "toy_shard_bytes": $shard, "toy_compute_ms": $exec_ms}]}
JSON
  : > "$tmp/exp1.csv"
  for i in $(seq 0 23); do
    m=opt-13b-a; [ $((i % 2)) -eq 1 ] && m=opt-13b-b
    for r in 1 2 3 4; do echo "$((i * 10)),$m" >> "$tmp/exp1.csv"; done
  done
  "$bin" --log-level warn sim --config "$tmp/exp1.json" --profile a100 --trace "$tmp/exp1.csv" --json |
    python3 -c "
import json,sys; j=json.load(sys.stdin)
print('(%d,%d)    %10.3f' % ($tp, $pp, j['overall']['mean_s']))"
done
echo
echo "Experiment 2 ($duration s per cell, seed 1, warm-up as the original's clients)"
printf '%-22s %5s %8s %8s %8s\n' rates cv "mean s" "p99 s" "swaps"
for group in "exp2-3-models 1,1,1 10,1,1 10,10,1" "exp2-6-models 1,1,1,1,1,1 10,10,1,1,1,1 10,10,10,10,1,1"; do
  set -- $group
  cfg=$1; shift
  for rates in "$@"; do
    for cv in 0.25 1 4; do
      "$bin" --log-level warn sim --config "$here/configs/sim/$cfg.json" --profile a100 --warm-up \
        --rates "$rates" --cv "$cv" --duration "$duration" --seed 1 --json |
        python3 -c "
import json,sys; j=json.load(sys.stdin); o=j['overall']
loads=max([d['shard_loads'] for d in j['swaps']['devices'].values()] or [0])
print('%-22s %5s %8.3f %8.3f %8.0f' % ('($rates)', '$cv', o['mean_s'], o['p99_s'], loads))"
    done
  done
done
