"""Prints guidellm's report and computron loadgen's for the same load side by side, with the
server's own view of each run (the vllm:* histograms of /metrics, differenced around the
run), so that a disagreement between the two clients can be told apart from the server.
Usage: guidellm_compare.py GUIDELLM_JSON LOADGEN_JSON METRICS_BEFORE METRICS_BETWEEN
       METRICS_AFTER GUIDELLM_CPU_S LOADGEN_CPU_S"""
import json
import sys


def histogram_means(path):
    """sum and count of each vllm: histogram, over every label set."""
    out = {}
    for line in open(path):
        if not line.startswith("vllm:") or line.startswith("#"):
            continue
        name, value = line.rsplit(" ", 1)
        family = name.split("{", 1)[0]
        for suffix in ("_sum", "_count"):
            if family.endswith(suffix):
                base = family[: -len(suffix)]
                out.setdefault(base, {"_sum": 0.0, "_count": 0.0})[suffix] += float(value)
    return out


def server_means(before, after):
    a, b = histogram_means(before), histogram_means(after)
    means = {}
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                 "e2e_request_latency_seconds", "request_queue_time_seconds"):
        key = "vllm:" + name
        n = b[key]["_count"] - a.get(key, {}).get("_count", 0)
        s = b[key]["_sum"] - a.get(key, {}).get("_sum", 0)
        means[name] = (s / n * 1e3 if n else float("nan"), int(n))
    return means


def main():
    g_path, l_path, m0, m1, m2, g_cpu, l_cpu = sys.argv[1:8]
    b = json.load(open(g_path))["benchmarks"][0]
    gm = b["metrics"]
    totals = gm["request_totals"]
    l = json.load(open(l_path))

    def g(key):
        s = gm[key]["successful"]
        return s["mean"], s["median"], s["percentiles"]["p99"]

    rows = [
        ("TTFT ms", g("time_to_first_token_ms"),
         (l["mean_ttft_ms"], l["median_ttft_ms"], l["p99_ttft_ms"])),
        ("ITL ms", g("inter_token_latency_ms"),
         (l["mean_itl_ms"], l["median_itl_ms"], l["p99_itl_ms"])),
        ("TPOT ms", g("time_per_output_token_ms"),
         (l["mean_tpot_ms"], l["median_tpot_ms"], l["p99_tpot_ms"])),
        ("e2e ms", tuple(x * 1e3 for x in g("request_latency")),
         (l["mean_e2el_ms"], l["median_e2el_ms"], l["p99_e2el_ms"])),
    ]
    print(f"requests: guidellm {totals['successful']} done, {totals['errored']} errored, "
          f"{totals['incomplete']} cut off at the end; loadgen {l['completed']} done, "
          f"{l['failed']} failed")
    out_g = gm["output_token_count"]["successful"]["total_sum"] / b["duration"]
    print(f"output tokens/s: guidellm {out_g:.2f}, loadgen {l['output_throughput']:.2f}")
    print(f"client CPU seconds: guidellm {float(g_cpu):.1f}, loadgen {float(l_cpu):.1f}")
    print(f"{'':10} {'guidellm mean/median/p99':>28} {'loadgen mean/median/p99':>28}")
    for name, a, c in rows:
        print(f"{name:10} {a[0]:9.1f}{a[1]:9.1f}{a[2]:10.1f} {c[0]:9.1f}{c[1]:9.1f}{c[2]:10.1f}")
    print("the server's own means over each run (vllm:* histograms):")
    sg, sl = server_means(m0, m1), server_means(m1, m2)
    for name in sg:
        print(f"  {name:32} guidellm's run {sg[name][0]:8.1f} ms ({sg[name][1]:4d})   "
              f"loadgen's run {sl[name][0]:8.1f} ms ({sl[name][1]:4d})")


main()
