# Shared by the bench scripts that run `computron serve` on a config derived from
# configs/opt-seeded.json (the seeded OPT-125M models they measure): start a server, wait for it, stop it. Source it after setting
# root, bin, port and dir.
#   serve_start LABEL SED_SCRIPT  (SED_SCRIPT edits opt-seeded.json; the port is set here)
#   serve_config LABEL CONFIG     (a config file of its own, listening on $port)
#   serve_stop
bench_pid=

serve_start() {  # LABEL SED_SCRIPT
  sed "$2; s/\"port\": 8000/\"port\": $port/" "$root/configs/opt-seeded.json" >"$dir/config-$1.json"
  serve_config "$1" "$dir/config-$1.json"
}

serve_config() {  # LABEL CONFIG (a config whose http.port is $port)
  "$bin" serve --config "$2" >"$dir/serve-$1.log" 2>&1 &
  bench_pid=$!
  for _ in $(seq 1 120); do
    curl -sf "localhost:$port/v2/health/ready" >/dev/null 2>&1 && return 0
    sleep 1
  done
  echo "the server ($1) was not ready within 120 s; see $dir/serve-$1.log" >&2
  return 1
}

serve_stop() {
  [ -n "$bench_pid" ] || return 0
  kill "$bench_pid" 2>/dev/null || true
  wait "$bench_pid" 2>/dev/null || true
  bench_pid=
}
