#!/usr/bin/env bash
# Compares the scheduling policies in the simulator: victims (lru, cost), dispatch order
# (fcfs, resident-first, edf), prefetch (off, on) and drop-late (off, on: the SLO is each
# request's deadline and a request that cannot meet it is refused at its turn), on every
# full-size experiment-2 cell (configs/sim/exp2-*.json) and on a skewed 20-model workload
# (configs/sim/skewed-20-models.json, power law 1). Prints, per workload group and policy,
# the mean over cells of: mean latency of the answered requests, their p99, and SLO
# attainment (answered within the SLO / sent; a dropped request misses it).
# Usage: bench/policies.sh [path/to/computron] [seconds per cell] [SLO seconds]
set -euo pipefail
bin=${1:-build/apps/computron/computron}
duration=${2:-600}
slo=${3:-0.5}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$bin" "$duration" "$slo" "$here" "$tmp" <<'PY'
import itertools, json, subprocess, sys
binary, duration, slo, here, tmp = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]
groups = [
    ("exp2, 3 models", "exp2-3-models",
     [["--warm-up", "--rates", r, "--cv", cv] for r in ("1,1,1", "10,1,1", "10,10,1")
      for cv in ("0.25", "1", "4")]),
    ("exp2, 6 models", "exp2-6-models",
     [["--warm-up", "--rates", r, "--cv", cv]
      for r in ("1,1,1,1,1,1", "10,10,1,1,1,1", "10,10,10,10,1,1") for cv in ("0.25", "1", "4")]),
    ("skewed, 20 models", "skewed-20-models",
     [["--power-law", "1", "--total-rate", t, "--cv", cv] for t in ("10", "30")
      for cv in ("1", "4")]),
]
combos = list(itertools.product(("lru", "cost"), ("fcfs", "resident-first", "edf"),
                                (False, True), (False, True)))
for title, cfg_name, cells in groups:
    base = json.load(open(f"{here}/configs/sim/{cfg_name}.json"))
    rows = []
    for policy, dispatch, prefetch, drop in combos:
        cfg = json.loads(json.dumps(base))
        cfg["scheduler"].update({"policy": policy, "prefetch": prefetch})
        cfg["batching"]["dispatch"] = dispatch
        path = f"{tmp}/c.json"
        json.dump(cfg, open(path, "w"))
        means, p99s, slos = [], [], []
        for cell in cells:
            cmd = [binary, "--log-level", "warn", "sim", "--config", path, "--profile", "a100",
                   "--duration", duration, "--seed", "1", "--slo", str(slo), "--json", *cell]
            if drop:
                cmd.append("--drop-late")
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode not in (0, 3):  # 3: some requests failed (dropped ones)
                sys.exit(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr}")
            o = json.loads(run.stdout)["overall"]
            means.append(o["mean_s"])
            p99s.append(o["p99_s"])
            slos.append(o["slo_attainment"])
        rows.append((sum(slos) / len(slos), sum(means) / len(means), max(means),
                     sum(p99s) / len(p99s), policy, dispatch, prefetch, drop))
    print(f"\n{title} ({len(cells)} cells, {duration} s each, SLO {slo} s)")
    print(f"{'victims':7} {'dispatch':14} {'prefetch':8} {'drop-late':9} {'SLO att.':>8} "
          f"{'mean s':>7} {'worst mean':>10} {'p99 s':>7}")
    for att, mean, worst, p99, policy, dispatch, prefetch, drop in sorted(rows, key=lambda r: (-r[0], r[1])):
        print(f"{policy:7} {dispatch:14} {('on' if prefetch else 'off'):8} "
              f"{('on' if drop else 'off'):9} {att:8.4f} {mean:7.3f} {worst:10.3f} {p99:7.3f}")
PY
