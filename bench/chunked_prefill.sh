#!/usr/bin/env bash
# Chunked prefill of joiners (issue 30): on configs/opt-seeded.json (three OPT-125M TP2 x PP2,
# emulated), model a only, an open-loop workload of mostly short prompts with long
# outputs and now and then a long prompt (CSV rows drawn at random: 7 of 8 are 16 prompt
# tokens and 128 output tokens, 1 of 8 is 1536 prompt tokens and 16 output tokens).
# The same seeded arrivals run with batching.prefill_chunk 0 (a joiner's whole prompt in
# one step) and 256, each on a fresh server, in one run: the running rows' inter-token
# latency (p99 and max), TTFT and output tokens/s.
#   bench/chunked_prefill.sh [SECONDS] [RATE]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build/apps/computron/computron"
secs=${1:-40}
rate=${2:-1.5}
port=18797
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_scratch
{
  echo "prompt_len,output_len"
  for _ in 1 2 3 4 5 6 7; do echo "16,128"; done
  echo "1536,16"
} >"$dir/lengths.csv"
for chunk in 0 256; do
  serve_start "chunk-$chunk" "s/\"prefill_chunk\": 512/\"prefill_chunk\": $chunk/"
  grep -q "\"prefill_chunk\": $chunk" "$dir/config-chunk-$chunk.json"  # the setting took
  curl -sf "localhost:$port/v1/completions" -H 'content-type: application/json' \
    -d '{"model": "opt-125m-a", "prompt": [2, 7, 300, 44], "max_tokens": 2}' >/dev/null
  "$bin" loadgen --url "http://127.0.0.1:$port" --models opt-125m-a --rates "$rate" \
    --duration "$secs" --lengths "$dir/lengths.csv" --api completions --seed 7 \
    --no-progress --json \
    >"$dir/run-$chunk.json" 2>"$dir/run-$chunk.log" || true
  serve_stop
done
python3 - "$dir/run-0.json" "$dir/run-256.json" <<'PY'
import json, sys
runs = [json.load(open(p)) for p in sys.argv[1:3]]
for label, s in zip(["prefill_chunk 0 (whole)", "prefill_chunk 256"], runs):
    print(f"{label}: completed {s['completed']}, failed {s.get('failed', 0)}, "
          f"output tok/s {s['output_throughput']:.1f}, ITL median {s['median_itl_ms']:.0f} ms, "
          f"p99 {s['p99_itl_ms']:.0f} ms, max {s['max_itl_ms']:.0f} ms, "
          f"TTFT median {s['median_ttft_ms']:.0f} ms, p99 {s['p99_ttft_ms']:.0f} ms")
w, c = runs
print(f"chunked / whole: p99 ITL {c['p99_itl_ms'] / w['p99_itl_ms']:.2f}x, "
      f"max ITL {c['max_itl_ms'] / w['max_itl_ms']:.2f}x, "
      f"output tok/s {c['output_throughput'] / w['output_throughput']:.2f}x, "
      f"p99 TTFT {c['p99_ttft_ms'] / w['p99_ttft_ms']:.2f}x")
PY
