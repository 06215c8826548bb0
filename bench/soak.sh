#!/usr/bin/env bash
# Soak: `computron serve` on configs/opt-seeded.json (3 OPT-125M models TP2 x PP2 on 4
# emulated devices, of which 2 fit: requests swap) under an open-loop mixed load for
# SECONDS, with bad requests interleaved (malformed JSON, unknown models, a wrong input
# name, a body over the limit, wrong methods, a client that goes away mid-request). Records
# the server's RSS, open file descriptors and threads after a warm-up and after the load
# has drained, and fails when any of them grew (RSS: by more than 10%) or a good request
# was lost.
# Usage: bench/soak.sh [SECONDS=600] [path/to/computron]
set -euo pipefail
seconds=${1:-600}
bin=${2:-build/apps/computron/computron}
tmp=$(mktemp -d)
server=0
bad=0
cleanup() {
  [ "$bad" -gt 0 ] && kill "$bad" 2>/dev/null || true
  [ "$server" -gt 0 ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

"$bin" serve --config "$(dirname "$0")/../configs/opt-seeded.json" --port 0 --console-port -1 >"$tmp/serve.out" 2>"$tmp/serve.err" &
server=$!
for _ in $(seq 1 600); do
  grep -q "listening on" "$tmp/serve.out" 2>/dev/null && break
  sleep 0.1
done
url=$(grep -o 'http://[0-9.:]*' "$tmp/serve.out" | head -1)
[ -n "$url" ] || { echo "soak: the server did not start" >&2; cat "$tmp/serve.err" >&2; exit 1; }

sample() {  # rss_kib fds threads
  local rss threads fds
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$server/status")
  threads=$(awk '/^Threads:/ {print $2}' "/proc/$server/status")
  fds=$(ls "/proc/$server/fd" | wc -l)
  echo "$rss $fds $threads"
}

# Warm-up: every model loaded once, every route touched once.
start=$(date +%s)
say() { echo "soak: $* ($(($(date +%s) - start)) s)" >&2; }
"$bin" loadgen --url "$url" --total-rate 1 --duration 10 --no-progress --json >"$tmp/warm.json"
read -r rss0 fds0 threads0 < <(sample)
say "warmed up: RSS $((rss0 / 1024)) MiB, $fds0 fds, $threads0 threads"

bad_requests() {
  local big="$tmp/big.json" n=0
  head -c $((2 << 20)) /dev/zero | tr '\0' 'x' >"$big"
  while true; do
    curl -s -o /dev/null -X POST "$url/v2/models/opt-125m-a/infer" -d '{"inputs": [' || true
    curl -s -o /dev/null -X POST "$url/v2/models/nope/infer" -d '{}' || true
    curl -s -o /dev/null -X POST "$url/v2/models/opt-125m-b/infer" \
      -d '{"inputs": [{"name": "foo", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}]}' || true
    curl -s -o /dev/null -X POST "$url/v2/models/opt-125m-c/infer" --data-binary @"$big" || true
    curl -s -o /dev/null -X DELETE "$url/v2/health/ready" || true
    curl -s -o /dev/null -X POST "$url/v1/completions" -d '{"model": 5, "prompt": "x"}' || true
    # A client that gives up after 50 ms while its request is queued or running.
    curl -s -o /dev/null -m 0.05 -X POST "$url/v1/completions" \
      -d '{"model": "opt-125m-a", "prompt": "hello there", "max_tokens": 32}' || true
    n=$((n + 7))
    echo "$n" >"$tmp/bad.count" 2>/dev/null || return 0
    sleep 0.2
  done
}
bad_requests &
bad=$!

# About what 2 cores serve (OPT-125M forwards on the CPU plus a swap every few requests).
"$bin" loadgen --url "$url" --rates 0.6,0.3,0.15 --cv 2 --duration "$seconds" --max-tokens 4 \
  --no-progress --json >"$tmp/load.json" 2>"$tmp/load.err" || true  # failures are counted below
[ -n "${SOAK_KEEP:-}" ] && cp "$tmp/load.json" "$SOAK_KEEP"
[ -s "$tmp/load.json" ] || { echo "soak: loadgen wrote no summary" >&2; tail -5 "$tmp/load.err" >&2; exit 1; }
kill "$bad" 2>/dev/null; wait "$bad" 2>/dev/null || true
say "load done"
# Drain: requests whose clients gave up still run to the end, and a refused body is read
# for up to 30 s (lingering close). Up to 120 s for the descriptors to come back.
for _ in $(seq 1 120); do
  read -r rss1 fds1 threads1 < <(sample)
  [ "$fds1" -le "$fds0" ] && break
  sleep 1
done
sleep 2
read -r rss1 fds1 threads1 < <(sample)
say "drained"
kill -0 "$server" 2>/dev/null || { echo "soak: the server died" >&2; exit 1; }

python3 - "$tmp/load.json" "$(cat "$tmp/bad.count" 2>/dev/null || echo 0)" \
  "$rss0" "$fds0" "$threads0" "$rss1" "$fds1" "$threads1" "$seconds" <<'PY'
import json, sys
load = json.load(open(sys.argv[1]))
bad = int(sys.argv[2])
rss0, fds0, th0, rss1, fds1, th1 = map(int, sys.argv[3:9])
secs = sys.argv[9]
ok, failed, unsent = load["ok"], load["failed"], load.get("unsent", 0)
loads = load.get("swaps", {}).get("shard_loads", 0)
print(f"soak {secs} s: {ok} good requests answered, {failed} failed, {unsent} unsent, "
      f"{loads} shard loads; {bad} bad requests interleaved")
print(f"{'':8} {'start':>10} {'end':>10}")
print(f"{'RSS MiB':8} {rss0/1024:10.1f} {rss1/1024:10.1f}")
print(f"{'fds':8} {fds0:10d} {fds1:10d}")
print(f"{'threads':8} {th0:10d} {th1:10d}")
if load.get("errors"):
    print("errors:", json.dumps(load["errors"]))
bad_growth = rss1 > rss0 * 1.10 or fds1 > fds0 or th1 > th0 or failed > 0 or unsent > 0
sys.exit(1 if bad_growth else 0)
PY
