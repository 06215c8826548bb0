#!/usr/bin/env bash
# LoRA adapters on emulated devices (issue 47), each figure beside its comparison in one run.
# Bases are Hugging Face folders of seeded random bf16 weights, adapters PEFT folders of
# seeded random bf16 pairs (alpha = 2 r), both written by bench/lora_bench.py. Prompts are
# token ids (the bases have no tokenizer), completions greedy with ignore_eos.
#   1. many adapters: a Qwen2.5-0.5B-shaped base and LORA_COUNT (2000) rank-16 q/v adapters in
#      one repository folder; start-up to ready against the base alone, RSS, then 200
#      requests (max_tokens 4, 16 at once) to random adapters; then 100 more registered
#      through POST /v1/load_lora_adapter, timed one by one; and a second base model added
#      to the repository and registered (POST /v2/repository/models/NAME/load) beside the
#      adapters, against the same beside none.
#   2. decode: a SmolLM2-135M-shaped base, batch 32 (32 requests at once, 64 tokens, 16-token
#      prompts) all of the base against spread over 8 rank-16 q/v adapters, alternating.
#   3. an adapter's load against bytes / link: rank 16 on all 7 projections of a
#      Llama-3.1-8B-shaped base cut to LORA_8B_LAYERS layers (a full 8B base does not fit
#      this machine twice over), at link_gbps 2 and 25.
#   4. (goals 4 and 5) switching fine-tunes of the 0.5B base (rank 16, all 7 projections):
#      a request of a cold adapter B after a warm A (max_tokens 1: its first token), against
#      B's load alone, a warm adapter's request, a decode step, and a whole-model swap to a full fine-tune of
#      the same size served as its own model (the device holds one of the two).
#   5. registering a model beside 0, 100 and 300 adapters (SmolLM2-135M shape, 1.84 MB each):
#      a second base added to the repository and loaded, twice each.
# About 20 minutes on 2 cores (part 1 about 8). With PREFAULT (the default) each server's
# device memory is resident from its start: part 3's peak RSS is about 12.3 GiB (8 GiB of
# device, the base's host copy), and part 1's start-up includes touching 1.5 GiB.
# Usage: bench/lora.sh [path/to/computron]   (PORT, LORA_COUNT, LORA_8B_LAYERS, PARTS="1 2 3 4 5",
#   PREFAULT=true|false, DTYPE: part 2's dtype, e.g. float32 on a CPU whose bf16 products are
#   slow (no AVX-512); the other parts' devices are sized for bf16)
set -euo pipefail
# Part 1 registers adapters through POST /v1/load_lora_adapter, which is off unless asked.
export VLLM_ALLOW_RUNTIME_LORA_UPDATING=true
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/apps/computron/computron}
venv=${COMPUTRON_VENV:-$HOME/.cache/computron/venv}
port=${PORT:-8141}
count=${LORA_COUNT:-2000}
layers8b=${LORA_8B_LAYERS:-8}
parts=${PARTS:-1 2 3 4 5}
# Emulated device memory touched at start (devices.prefault), so that an adapter's first
# load into fresh pages runs at the link's rate, not this machine's page-fault rate.
prefault=${PREFAULT:-true}
dtype_flag=()  # part 2's
[[ -n ${DTYPE:-} ]] && dtype_flag=(--dtype "$DTYPE")
# 2000 adapters take about 5 minutes to register here (bench/RESULTS.md).
export READY_WAIT_S=${READY_WAIT_S:-900}
py() { "$venv/bin/python3" "$root/bench/lora_bench.py" "$@"; }
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_scratch

config() {  # FILE REPOSITORY CAPACITY_MB LINK_GBPS [MAX_BATCH]
  cat >"$1" <<EOF
{"devices": {"kind": "emulated", "count": 1, "capacity_mb": $3, "link_gbps": $4,
             "prefault": $prefault},
 "http": {"host": "127.0.0.1", "port": $port, "max_batch_rows": 256},
 "scheduler": {"load_timeout_s": 600},
 "batching": {"max_batch_size": ${5:-32}, "continuous": true, "max_queue": 4096},
 "frontend": {"max_outstanding_per_model": 4096, "max_outstanding": 8192},
 "repository": "$2"}
EOF
}
rss_mb() { awk '/VmRSS/ {printf "%.0f", $2 / 1024}' "/proc/$bench_pid/status"; }
hwm_mb() { awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$bench_pid/status"; }
ready_line() { grep -o 'ready (.*)' "$dir/serve-$1.log" | tail -1; }
# The time `computron serve` took from its start to /v2/health/ready, in seconds.
timed_start() {  # LABEL CONFIG
  local t0 t1
  t0=$(date +%s.%N)
  serve_config "$1" "$2"
  t1=$(date +%s.%N)
  start_s=$(echo "$t1 - $t0" | bc -l)
}
# Registers a repository folder added after start-up (POST .../load), in seconds.
register_model() {  # NAME
  local t0 t1 code
  t0=$(date +%s.%N)
  code=$(curl -s -X POST "localhost:$port/v2/repository/models/$1/load" -o /dev/null -w "%{http_code}")
  t1=$(date +%s.%N)
  echo "$(echo "$t1 - $t0" | bc -l | cut -c1-7) (HTTP $code)"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
load_s() { py metrics "$port" "$1" | "$venv/bin/python3" -c 'import json,sys; print(json.load(sys.stdin)["computron_model_load_seconds_total"])'; }
registered_bytes() { grep -o "registered $1 (.*, [0-9]* bytes)" "$dir/serve-$2.log" | grep -o '[0-9]* bytes' | tail -1 | cut -d' ' -f1; }

echo "machine: $(nproc) cores, $(free -g | awk '/Mem/ {print $2}') GiB; $(date -u +%F); $(git -C "$root" rev-parse --short HEAD)"

qwen=(--type qwen2 --hidden 896 --layers 24 --heads 14 --kv 2 --ffn 4864 --vocab 151936 --tie)
if [[ " $parts " == *" 1 "* || " $parts " == *" 4 "* ]]; then
  mkdir -p "$dir/qwen-repo" "$dir/qwen-base"
  py base "$dir/qwen-repo/qwen" "${qwen[@]}"
  ln -s "$dir/qwen-repo/qwen" "$dir/qwen-base/qwen"
fi

if [[ " $parts " == *" 1 "* ]]; then
  echo "== 1. $count rank-16 q/v adapters of a Qwen2.5-0.5B-shaped base (one repository)"
  py adapters "$dir/qwen-repo" --base-dir "$dir/qwen-repo/qwen" --base-name qwen \
    --prefix lora --count "$count" --distinct 16
  py adapters "$dir/api" --base-dir "$dir/qwen-repo/qwen" --base-name qwen --prefix api \
    --count 1 --distinct 1 --seed 9000
  config "$dir/base.json" "$dir/qwen-base" 1536 2
  config "$dir/many.json" "$dir/qwen-repo" 1536 2
  timed_start base "$dir/base.json"
  echo "base alone: ready in $start_s s ($(ready_line base)); RSS $(rss_mb) MiB, peak $(hwm_mb) MiB"
  cp -al "$dir/qwen-repo/qwen" "$dir/qwen-base/qwen2nd"
  echo "a second base (a copy of qwen) registered beside 0 adapters: $(register_model qwen2nd) s"
  serve_stop
  timed_start many "$dir/many.json"
  echo "base + $count adapters: ready in $start_s s ($(ready_line many)); RSS $(rss_mb) MiB, peak $(hwm_mb) MiB"
  py spread "$port" --prefix lora --count "$count" --requests 200 --concurrency 16 --max-tokens 4
  echo "after the requests: RSS $(rss_mb) MiB, peak $(hwm_mb) MiB"
  : >"$dir/api-times"
  for i in $(seq 1 100); do py register "$port" "api-$i" "$dir/api/api" >>"$dir/api-times"; done
  echo "100 more through /v1/load_lora_adapter (after $count): first $(head -1 "$dir/api-times") s," \
    "median $(median <"$dir/api-times") s, last $(tail -1 "$dir/api-times") s; RSS $(rss_mb) MiB"
  py spread "$port" --prefix lora --count "$count" --requests 20 --concurrency 4 --max-tokens 4
  cp -al "$dir/qwen-repo/qwen" "$dir/qwen-repo/qwen2nd"
  echo "a second base (a copy of qwen) registered beside $((count + 100)) adapters: $(register_model qwen2nd) s"
  serve_stop
fi

if [[ " $parts " == *" 2 "* ]]; then
  echo "== 2. decode at batch 32: base alone against 8 rank-16 q/v adapters (SmolLM2-135M shape)"
  mkdir -p "$dir/smol-repo"
  py base "$dir/smol-repo/smol" --hidden 576 --layers 30 --heads 9 --kv 3 --ffn 1536 --vocab 49152 --tie
  py adapters "$dir/smol-repo" --base-dir "$dir/smol-repo/smol" --base-name smol \
    --prefix smol-lora --count 8 --distinct 8
  config "$dir/smol.json" "$dir/smol-repo" 2048 2
  serve_config smol "$dir/smol.json" "${dtype_flag[@]}"
  loras=$(echo smol-lora-0000{0..7} | tr ' ' ,)
  # Warm: every adapter resident and the base's first batches done.
  py decode "$port" --models smol --max-tokens 4 >/dev/null
  py decode "$port" --models "$loras" --max-tokens 4 >/dev/null
  for round in 1 2 3; do
    echo "round $round base:     $(py decode "$port" --models smol --max-tokens 64)"
    echo "round $round 8 loras:  $(py decode "$port" --models "$loras" --max-tokens 64)"
  done
  serve_stop
fi

if [[ " $parts " == *" 3 "* ]]; then
  echo "== 3. a rank-16 all-projection adapter of Llama-3.1-8B's layer shape, $layers8b layers"
  mkdir -p "$dir/big-repo"
  py base "$dir/big-repo/big" --hidden 4096 --layers "$layers8b" --heads 32 --kv 8 --ffn 14336 \
    --vocab 32000 --tie
  py adapters "$dir" --base-dir "$dir/big-repo/big" --base-name big --prefix big-lora \
    --projs q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
  file_bytes=$(stat -c %s "$dir/big-lora/adapter_model.safetensors")
  for link in 2 25; do
    config "$dir/big-$link.json" "$dir/big-repo" 8192 "$link"
    serve_config "big-$link" "$dir/big-$link.json"
    py complete "$port" big --max-tokens 1 >/dev/null
    base_bytes=$(registered_bytes big "big-$link")
    echo "link $link GB/s: the base's own load $(load_s big) s for $base_bytes bytes;" \
      "bytes / link $(echo "$base_bytes / ($link * 10^9)" | bc -l | cut -c1-8) s"
    : >"$dir/big-loads-$link"
    for i in 1 2 3 4 5; do
      py register "$port" "big-lora-$i" "$dir/big-lora" >/dev/null
      # Loaded on its own first (no request computing beside the copy on these 2 cores),
      # then asked for.
      wall=$(py load "$port" "big-lora-$i")
      req=$(py complete "$port" "big-lora-$i" --max-tokens 1)
      echo "$(load_s "big-lora-$i") $wall $req" >>"$dir/big-loads-$link"
    done
    bytes=$(registered_bytes big-lora-1 "big-$link")
    echo "link $link GB/s: adapter file $file_bytes bytes, registered ${bytes:-?} bytes;" \
      "load s (metrics), the load call's s and the first request's s: $(tr '\n' ';' <"$dir/big-loads-$link");" \
      "median load $(cut -d' ' -f1 "$dir/big-loads-$link" | median) s;" \
      "file bytes / link $(echo "$file_bytes / ($link * 10^9)" | bc -l | cut -c1-8) s;" \
      "RSS $(rss_mb) MiB"
    serve_stop
  done
fi

if [[ " $parts " == *" 4 "* ]]; then
  echo "== 4. switching fine-tunes of the 0.5B base: adapter B after A, and a whole-model swap"
  mkdir -p "$dir/ft-repo/qwen-ft"
  ln -s "$dir/qwen-repo/qwen" "$dir/ft-repo/qwen"
  for f in "$dir/qwen-repo/qwen"/*; do ln "$f" "$dir/ft-repo/qwen-ft/"; done
  all=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
  py adapters "$dir/ft-repo" --base-dir "$dir/qwen-repo/qwen" --base-name qwen --prefix ft-a \
    --projs "$all" --seed 500
  py adapters "$dir" --base-dir "$dir/qwen-repo/qwen" --base-name qwen --prefix ft-b \
    --projs "$all" --seed 600
  # Room for one 0.5B model (988 MB) and its adapters, not two models.
  config "$dir/ft.json" "$dir/ft-repo" 1536 2
  serve_config ft "$dir/ft.json"
  py complete "$port" qwen >/dev/null
  py complete "$port" ft-a >/dev/null
  : >"$dir/switch"
  for i in 1 2 3 4 5; do
    py register "$port" "ft-b-$i" "$dir/ft-b" >/dev/null
    warm=$(py complete "$port" ft-a)
    cold=$(py complete "$port" "ft-b-$i")
    echo "$warm $cold $(load_s "ft-b-$i")" >>"$dir/switch"
  done
  echo "adapter bytes: registered $(registered_bytes ft-a ft) (file $(stat -c %s "$dir/ft-b/adapter_model.safetensors"))"
  echo "A warm, B cold (1 token each, s), B's load s: $(tr '\n' ';' <"$dir/switch")"
  echo "medians: A warm $(cut -d' ' -f1 "$dir/switch" | median) s, B cold $(cut -d' ' -f2 "$dir/switch" | median) s, B load $(cut -d' ' -f3 "$dir/switch" | median) s"
  for m in ft-a qwen; do
    one=$(for _ in 1 2 3; do py complete "$port" "$m" --max-tokens 1; done | median)
    many=$(for _ in 1 2 3; do py complete "$port" "$m" --max-tokens 17; done | median)
    echo "$m alone: 1 token $one s; decode step ($many - $one) / 16 = $(echo "($many - $one) / 16" | bc -l | cut -c1-6) s"
  done
  : >"$dir/swap"
  for i in 1 2 3; do
    before=$(load_s qwen-ft)
    t=$(py complete "$port" qwen-ft)
    echo "$t $(echo "$(load_s qwen-ft) - $before" | bc -l) $(py complete "$port" qwen-ft)" >>"$dir/swap"
    py complete "$port" ft-a >/dev/null  # back to the base (and its adapter)
  done
  echo "whole-model swap to qwen-ft (1 token s, its load s, then warm 1 token s): $(tr '\n' ';' <"$dir/swap");" \
    "median $(cut -d' ' -f1 "$dir/swap" | median) s; registered $(registered_bytes qwen-ft ft) bytes"
  serve_stop
fi

if [[ " $parts " == *" 5 "* ]]; then
  echo "== 5. registering a second base beside N adapters (SmolLM2-135M shape)"
  for n in 0 100 300; do
    rm -rf "$dir/reg-repo"
    mkdir -p "$dir/reg-repo"
    py base "$dir/reg-repo/smol" --hidden 576 --layers 30 --heads 9 --kv 3 --ffn 1536 \
      --vocab 49152 --tie >/dev/null
    [ "$n" -gt 0 ] && py adapters "$dir/reg-repo" --base-dir "$dir/reg-repo/smol" \
      --base-name smol --prefix a --count "$n" --distinct 4 >/dev/null
    config "$dir/reg.json" "$dir/reg-repo" 4096 2
    serve_config "reg-$n" "$dir/reg.json"
    cp -al "$dir/reg-repo/smol" "$dir/reg-repo/smol2"
    first=$(register_model smol2)
    cp -al "$dir/reg-repo/smol" "$dir/reg-repo/smol3"
    echo "beside $n adapters ($(ready_line "reg-$n")): a second base $first s, a third $(register_model smol3) s"
    serve_stop
  done
fi
