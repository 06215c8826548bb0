#include "net/client/llm_metrics.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "workload/arrivals.hpp"
#include "workload/stats.hpp"

namespace computron::net {

namespace {

using json = nlohmann::json;

/// The samples of one group while they are gathered.
struct samples {
  std::vector<double> ttft, tpot, itl, e2el;
};

void add(llm_group& g, samples& x, const stream_record& r, const llm_slo& slo) {
  ++g.sent;
  if (!r.ok()) {
    ++g.failed;
    auto kind = r.error_kind.empty() ? std::string{"unknown"} : r.error_kind;
    ++g.errors[kind];
    g.first_error.emplace(kind, r.error);
    return;
  }
  ++g.ok;
  g.input_tokens += r.prompt_tokens;
  g.output_tokens += r.output_tokens;
  if (meets_slo(r, slo)) ++g.good;
  x.ttft.push_back(r.ttft_s());
  x.e2el.push_back(r.e2e_s());
  if (auto t = r.tpot_s()) x.tpot.push_back(*t);
  auto gaps = r.itl_s();
  x.itl.insert(x.itl.end(), gaps.begin(), gaps.end());
}

void finish(llm_group& g, const samples& x, const llm_summary& s) {
  const double d = s.duration_s;
  auto per_s = [d](double n) { return d > 0 ? n / d : 0.0; };
  g.request_throughput = per_s(static_cast<double>(g.ok));
  g.goodput = per_s(static_cast<double>(g.good));
  g.output_throughput = per_s(static_cast<double>(g.output_tokens));
  g.total_token_throughput = per_s(static_cast<double>(g.input_tokens + g.output_tokens));
  if (s.slo.any())
    g.slo_attainment = g.sent == 0 ? 0 : static_cast<double>(g.good) / static_cast<double>(g.sent);
  g.ttft = summarize_metric(x.ttft, s.percentiles);
  g.tpot = summarize_metric(x.tpot, s.percentiles);
  g.itl = summarize_metric(x.itl, s.percentiles);
  g.e2el = summarize_metric(x.e2el, s.percentiles);
}

struct metric_view {
  const char* key;     // vLLM's JSON name
  const char* name;    // as printed
  const char* header;  // the section's title
  metric_summary llm_group::*field;
};

const metric_view metrics[] = {
    {"ttft", "TTFT", " Time to First Token ", &llm_group::ttft},
    {"tpot", "TPOT", " Time per Output Token (excl. 1st token) ", &llm_group::tpot},
    {"itl", "ITL", " Inter-token Latency ", &llm_group::itl},
    {"e2el", "E2EL", " End-to-end Latency ", &llm_group::e2el},
};

void metric_json(json& j, const metric_summary& m, const char* key) {
  j[fmt::format("mean_{}_ms", key)] = m.mean * 1e3;
  j[fmt::format("median_{}_ms", key)] = m.median * 1e3;
  j[fmt::format("std_{}_ms", key)] = m.stdev * 1e3;
  j[fmt::format("max_{}_ms", key)] = m.max * 1e3;
  for (auto& [p, v] : m.percentiles) j[fmt::format("{}_{}_ms", percentile_name(p), key)] = v * 1e3;
}

json group_json(const llm_group& g, const llm_summary& s) {
  json j{{"sent", g.sent},
         {"ok", g.ok},
         {"completed", g.ok},
         {"failed", g.failed},
         {"total_input_tokens", g.input_tokens},
         {"total_output_tokens", g.output_tokens},
         {"request_throughput", g.request_throughput},
         {"output_throughput", g.output_throughput},
         {"total_token_throughput", g.total_token_throughput},
         {"errors", g.errors},
         {"first_errors", g.first_error}};
  if (s.slo.any()) {
    j["request_goodput"] = g.goodput;
    j["slo_attainment"] = g.slo_attainment;
  }
  for (auto& m : metrics) metric_json(j, g.*m.field, m.key);
  return j;
}

std::string shorten(const std::string& s, size_t n) {
  return s.size() > n ? s.substr(0, n - 1) + "~" : s;
}

}  // namespace

std::optional<double> stream_record::tpot_s() const {
  if (output_tokens < 2) return std::nullopt;
  return (e2e_s() - ttft_s()) / static_cast<double>(output_tokens - 1);
}

std::vector<double> stream_record::itl_s() const {
  std::vector<double> out;
  for (size_t i = 1; i < chunk_s.size(); ++i) out.push_back(chunk_s[i] - chunk_s[i - 1]);
  return out;
}

bool meets_slo(const stream_record& r, const llm_slo& slo) {
  if (!r.ok()) return false;
  if (slo.ttft_s > 0 && r.ttft_s() > slo.ttft_s) return false;
  if (slo.e2e_s > 0 && r.e2e_s() > slo.e2e_s) return false;
  if (slo.tpot_s > 0)
    if (auto t = r.tpot_s(); t && *t > slo.tpot_s) return false;
  return true;
}

metric_summary summarize_metric(const std::vector<double>& xs,
                                const std::vector<double>& percentiles) {
  metric_summary m;
  m.count = xs.size();
  for (auto p : percentiles) m.percentiles.emplace_back(p, 0.0);
  if (xs.empty()) return m;
  auto sorted = xs;
  std::sort(sorted.begin(), sorted.end());
  const auto n = static_cast<double>(sorted.size());
  m.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / n;
  double sq = 0;
  for (auto x : sorted) sq += (x - m.mean) * (x - m.mean);
  m.stdev = std::sqrt(sq / n);  // numpy's std: the population's
  m.median = workload::percentile(sorted, 0.5);
  m.max = sorted.back();
  for (auto& [p, v] : m.percentiles) v = workload::percentile(sorted, p / 100);
  return m;
}

caf::expected<std::vector<double>> parse_percentiles(const std::string& text,
                                                     const std::string& flag) {
  auto xs = workload::parse_numbers(text, flag);
  if (!xs) return xs.error();
  for (auto p : *xs)
    if (!(p > 0 && p <= 100))
      return make_error(ec::invalid_request,
                        fmt::format("{}: {} is not a percentile in (0, 100]", flag, p));
  std::sort(xs->begin(), xs->end());
  xs->erase(std::unique(xs->begin(), xs->end()), xs->end());
  return *xs;
}

std::string percentile_name(double p) {
  auto s = fmt::format("{:.3f}", p);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return "p" + s;
}

llm_summary summarize_llm(const std::vector<std::string>& models,
                          const std::vector<stream_record>& records, const llm_slo& slo,
                          const std::vector<double>& percentiles) {
  llm_summary s;
  s.models = models;
  s.slo = slo;
  s.percentiles = percentiles;
  s.per_model.resize(models.size());
  std::vector<samples> per(models.size());
  samples all;
  for (auto& r : records) {
    if (!r.sent()) {
      ++s.unsent;
      continue;
    }
    s.duration_s = std::max(s.duration_s, r.done_s);
    add(s.overall, all, r, slo);
    auto it = std::find(models.begin(), models.end(), r.model);
    if (it != models.end()) {
      auto i = static_cast<size_t>(it - models.begin());
      add(s.per_model[i], per[i], r, slo);
    }
  }
  finish(s.overall, all, s);
  for (size_t i = 0; i < models.size(); ++i) finish(s.per_model[i], per[i], s);
  return s;
}

std::string llm_table(const llm_summary& s, const std::vector<workload::device_traffic>& devices) {
  std::ostringstream o;
  auto& g = s.overall;
  auto line = [&](const std::string& label, const std::string& value) {
    o << fmt::format("{:<40} {:<10}\n", label, value);
  };
  auto num = [](double v) { return fmt::format("{:.2f}", v); };
  o << fmt::format("{:=^50}\n", " Serving Benchmark Result ");
  line("Successful requests:", std::to_string(g.ok));
  line("Failed requests:", std::to_string(g.failed));
  if (s.max_concurrency > 0)
    line("Maximum request concurrency:", std::to_string(s.max_concurrency));
  line("Benchmark duration (s):", num(s.duration_s));
  line("Total input tokens:", std::to_string(g.input_tokens));
  line("Total generated tokens:", std::to_string(g.output_tokens));
  line("Request throughput (req/s):", num(g.request_throughput));
  if (s.slo.any()) {
    line("Request goodput (req/s):", num(g.goodput));
    line("Requests within SLO (%):", num(100 * g.slo_attainment));
  }
  line("Output token throughput (tok/s):", num(g.output_throughput));
  line("Total Token throughput (tok/s):", num(g.total_token_throughput));
  for (auto& m : metrics) {
    auto& x = g.*m.field;
    o << fmt::format("{:-^50}\n", m.header);
    line(fmt::format("Mean {} (ms):", m.name), num(x.mean * 1e3));
    line(fmt::format("Median {} (ms):", m.name), num(x.median * 1e3));
    for (auto& [p, v] : x.percentiles) {
      if (p == 50) continue;  // the median, just printed
      auto word = percentile_name(p).substr(1);
      line(fmt::format("P{} {} (ms):", word, m.name), num(v * 1e3));
    }
  }
  o << std::string(50, '=') << '\n';
  if (s.models.size() > 1) {
    // Per model: the median and the highest percentile asked for.
    auto top = s.percentiles.empty() ? std::string{"max"} : percentile_name(s.percentiles.back());
    auto high = [](const metric_summary& x) {
      return (x.percentiles.empty() ? x.max : x.percentiles.back().second) * 1e3;
    };
    o << fmt::format("{:<20} {:>5} {:>6} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9}", "model", "ok",
                     "failed", "req/s", "out tok/s", "p50 TTFT", top + " TTFT", "p50 TPOT",
                     top + " TPOT");
    if (s.slo.any()) o << fmt::format(" {:>7}", "in SLO");
    o << "  (ms)\n";
    for (size_t i = 0; i < s.models.size(); ++i) {
      auto& m = s.per_model[i];
      o << fmt::format("{:<20} {:>5} {:>6} {:>8.2f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f}",
                       shorten(s.models[i], 20), m.ok, m.failed, m.request_throughput,
                       m.output_throughput, m.ttft.median * 1e3, high(m.ttft), m.tpot.median * 1e3,
                       high(m.tpot));
      if (s.slo.any()) o << fmt::format(" {:>6.1f}%", 100 * m.slo_attainment);
      o << '\n';
    }
  }
  if (s.unsent > 0) o << fmt::format("{} requests never sent (cancelled)\n", s.unsent);
  if (s.clipped > 0)
    o << fmt::format("{} requests shortened to fit their model's context\n", s.clipped);
  for (auto& [kind, n] : g.errors) {
    auto first = g.first_error.count(kind) ? g.first_error.at(kind) : std::string{};
    o << fmt::format("  failed: {} x {}{}\n", n, kind, first.empty() ? "" : ": first: " + first);
  }
  for (auto& d : devices)
    o << fmt::format(
        "  device {}: {:.0f} shard loads, {:.0f} evictions, {:.1f} MiB in, {:.2f} GB/s\n", d.device,
        d.shard_loads, d.evictions, d.bytes_loaded / 1048576.0, d.gbps());
  return o.str();
}

std::string llm_json(const llm_summary& s, const std::vector<workload::device_traffic>& devices,
                     const std::string& extra) {
  auto j = group_json(s.overall, s);
  j["unsent"] = s.unsent;
  j["duration"] = s.duration_s;
  j["max_concurrency"] = s.max_concurrency > 0 ? json(s.max_concurrency) : json();
  j["percentiles"] = s.percentiles;
  j["clipped"] = s.clipped;
  if (s.slo.any())
    j["slo"] = {{"ttft_s", s.slo.ttft_s}, {"tpot_s", s.slo.tpot_s}, {"e2e_s", s.slo.e2e_s}};
  j["models"] = json::object();
  for (size_t i = 0; i < s.models.size(); ++i)
    j["models"][s.models[i]] = group_json(s.per_model[i], s);
  json devs = json::object();
  for (auto& d : devices)
    devs[d.device] = {{"shard_loads", d.shard_loads},     {"evictions", d.evictions},
                      {"bytes_loaded", d.bytes_loaded},   {"load_seconds", d.load_seconds},
                      {"evict_seconds", d.evict_seconds}, {"gbps", d.gbps()}};
  j["devices"] = devs;
  if (!extra.empty()) {
    auto e = json::parse(extra, nullptr, false);
    if (e.is_object()) j.update(e);
  }
  return j.dump();
}

}  // namespace computron::net
