#include "workload/report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"

namespace computron::workload {

namespace {

using json = nlohmann::json;

void add(group_summary& g, const request_record& r, std::vector<double>& lat) {
  if (!r.sent()) return;
  ++g.sent;
  if (r.ok()) {
    ++g.ok;
    lat.push_back(r.latency_s());
    if (r.swapped) ++g.swapped;
  } else {
    ++g.failed;
    ++g.errors[r.error_kind.empty() ? "unknown" : r.error_kind];
  }
}

void finish(group_summary& g, const std::vector<double>& lat, double slo_s, double wall_s) {
  g.latency = summarize(lat, slo_s);
  g.throughput_rps = wall_s > 0 ? static_cast<double>(g.ok) / wall_s : 0;
  if (slo_s > 0)
    g.slo_attainment = g.sent == 0 ? 0
                                   : g.latency.slo_attainment * static_cast<double>(g.ok) /
                                         static_cast<double>(g.sent);
}

json group_json(const group_summary& g, double slo_s) {
  json j{{"sent", g.sent},           {"ok", g.ok},
         {"failed", g.failed},       {"throughput_rps", g.throughput_rps},
         {"mean_s", g.latency.mean}, {"p50_s", g.latency.p50},
         {"p90_s", g.latency.p90},   {"p99_s", g.latency.p99},
         {"max_s", g.latency.max},   {"swapped", g.swapped},
         {"errors", g.errors}};
  if (slo_s > 0) j["slo_attainment"] = g.slo_attainment;
  return j;
}

// ---- SVG ----------------------------------------------------------------------------

const char* palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

const char* color(size_t i) {
  return palette[i % (sizeof(palette) / sizeof(palette[0]))];
}

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

/// Round tick steps (1, 2, 5 x 10^k) giving about `n` ticks over [0, hi].
std::vector<double> ticks(double hi, int n = 6) {
  if (!(hi > 0)) return {0};
  double raw = hi / n;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> out;
  for (double t = 0; t <= hi * (1 + 1e-9); t += step) out.push_back(t);
  return out;
}

std::string tick_label(double v) {
  auto s = fmt::format("{:.3f}", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

/// A plot area with linear axes.
struct frame {
  double x0, y0, w, h;  // pixels: left, top, width, height
  double xmax, ymax;    // data ranges [0, max]
  double px(double x) const { return x0 + w * std::clamp(x / xmax, 0.0, 1.0); }
  double py(double y) const { return y0 + h - h * std::clamp(y / ymax, 0.0, 1.0); }
};

void axes(std::ostringstream& o, const frame& f, const std::string& xlabel,
          const std::string& ylabel, bool y_ticks = true) {
  o << fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333"/>)"
                   "\n",
                   f.x0, f.y0, f.w, f.h);
  for (double t : ticks(f.xmax)) {
    o << fmt::format(
        R"(<line x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}" stroke="#ddd"/><text x="{0:.1f}" y="{3}" font-size="11" text-anchor="middle">{4}</text>)"
        "\n",
        f.px(t), f.y0, f.y0 + f.h, f.y0 + f.h + 14, tick_label(t));
  }
  if (y_ticks)
    for (double t : ticks(f.ymax, 5)) {
      o << fmt::format(
          R"(<line x1="{0}" y1="{1:.1f}" x2="{2}" y2="{1:.1f}" stroke="#ddd"/><text x="{3}" y="{4:.1f}" font-size="11" text-anchor="end">{5}</text>)"
          "\n",
          f.x0, f.py(t), f.x0 + f.w, f.x0 - 4, f.py(t) + 4, tick_label(t));
    }
  o << fmt::format(R"(<text x="{}" y="{}" font-size="12" text-anchor="middle">{}</text>)"
                   "\n",
                   f.x0 + f.w / 2, f.y0 + f.h + 30, esc(xlabel));
  o << fmt::format(
      R"svg(<text x="{0}" y="{1}" font-size="12" text-anchor="middle" transform="rotate(-90 {0} {1})">{2}</text>)svg"
      "\n",
      f.x0 - 42, f.y0 + f.h / 2, esc(ylabel));
}

std::string svg_open(int w, int h, const std::string& title) {
  return fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" font-family="sans-serif">)"
      "\n"
      R"(<rect width="{0}" height="{1}" fill="white"/><text x="{2}" y="22" font-size="15" text-anchor="middle">{3}</text>)"
      "\n",
      w, h, w / 2, esc(title));
}

}  // namespace

run_summary summarize_run(const std::vector<std::string>& models,
                          const std::vector<request_record>& records, double slo_s,
                          std::vector<device_traffic> devices) {
  run_summary s;
  s.models = models;
  s.slo_s = slo_s;
  s.devices = std::move(devices);
  s.per_model.resize(models.size());
  std::vector<std::vector<double>> lat(models.size());
  std::vector<double> all;
  for (auto& r : records) {
    if (!r.sent()) {
      ++s.unsent;
      continue;
    }
    s.wall_s = std::max(s.wall_s, r.done_s);
    add(s.overall, r, all);
    auto it = std::find(models.begin(), models.end(), r.model);
    if (it != models.end()) {
      auto i = static_cast<size_t>(it - models.begin());
      add(s.per_model[i], r, lat[i]);
    }
  }
  finish(s.overall, all, slo_s, s.wall_s);
  for (size_t i = 0; i < models.size(); ++i) finish(s.per_model[i], lat[i], slo_s, s.wall_s);
  return s;
}

std::string to_json(const run_summary& s, const std::string& extra) {
  json j{{"sent", s.overall.sent},     {"ok", s.overall.ok},
         {"failed", s.overall.failed}, {"unsent", s.unsent},
         {"wall_s", s.wall_s},         {"overall", group_json(s.overall, s.slo_s)},
         {"errors", s.overall.errors}};
  if (s.slo_s > 0) j["slo_s"] = s.slo_s;
  j["models"] = json::object();
  for (size_t i = 0; i < s.models.size(); ++i)
    j["models"][s.models[i]] = group_json(s.per_model[i], s.slo_s);
  json devs = json::object();
  double loads = 0, evictions = 0, bytes = 0, secs = 0, evict_secs = 0;
  for (auto& d : s.devices) {
    devs[d.device] = {{"shard_loads", d.shard_loads},     {"evictions", d.evictions},
                      {"bytes_loaded", d.bytes_loaded},   {"load_seconds", d.load_seconds},
                      {"evict_seconds", d.evict_seconds}, {"gbps", d.gbps()}};
    loads += d.shard_loads;
    evictions += d.evictions;
    bytes += d.bytes_loaded;
    secs += d.load_seconds;
    evict_secs += d.evict_seconds;
  }
  j["swaps"] = {{"shard_loads", loads},
                {"evictions", evictions},
                {"bytes_loaded", bytes},
                {"mean_gbps_per_link", secs > 0 ? bytes / secs / 1e9 : 0.0},
                {"mean_evict_s", evictions > 0 ? evict_secs / evictions : 0.0},
                {"devices", devs}};
  if (!extra.empty()) {
    auto e = json::parse(extra, nullptr, false);
    if (e.is_object()) j.update(e);
  }
  return j.dump();
}

std::string to_table(const run_summary& s) {
  std::ostringstream o;
  o << fmt::format("{:<20} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}", "model", "sent",
                   "ok", "failed", "req/s", "mean s", "p50 s", "p90 s", "p99 s", "max s");
  if (s.slo_s > 0) o << fmt::format(" {:>7}", "in SLO");
  o << '\n';
  auto row = [&](const std::string& name, const group_summary& g) {
    o << fmt::format(
        "{:<20} {:>6} {:>6} {:>6} {:>8.2f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>8.3f}",
        name.size() > 20 ? name.substr(0, 19) + "~" : name, g.sent, g.ok, g.failed,
        g.throughput_rps, g.latency.mean, g.latency.p50, g.latency.p90, g.latency.p99,
        g.latency.max);
    if (s.slo_s > 0) o << fmt::format(" {:>6.1f}%", 100 * g.slo_attainment);
    o << '\n';
  };
  for (size_t i = 0; i < s.models.size(); ++i) row(s.models[i], s.per_model[i]);
  row("all", s.overall);
  o << fmt::format("{} requests in {:.2f} s; {} waited for a swap", s.overall.sent, s.wall_s,
                   s.overall.swapped);
  if (s.unsent > 0) o << fmt::format("; {} never sent (cancelled)", s.unsent);
  o << '\n';
  for (auto& [kind, n] : s.overall.errors) o << fmt::format("  failed: {} x {}\n", n, kind);
  for (auto& d : s.devices)
    o << fmt::format(
        "  device {}: {:.0f} shard loads, {:.0f} evictions, {:.1f} MiB in, {:.2f} GB/s\n", d.device,
        d.shard_loads, d.evictions, d.bytes_loaded / 1048576.0, d.gbps());
  return o.str();
}

std::string latency_cdf_svg(const std::vector<std::string>& models,
                            const std::vector<request_record>& records) {
  const int W = 900, H = 520;
  std::vector<std::vector<double>> lat(models.size());
  double xmax = 0;
  for (auto& r : records) {
    if (!r.ok()) continue;
    auto it = std::find(models.begin(), models.end(), r.model);
    if (it == models.end()) continue;
    lat[static_cast<size_t>(it - models.begin())].push_back(r.latency_s());
    xmax = std::max(xmax, r.latency_s());
  }
  frame f{70, 40, W - 110.0, H - 100.0, xmax > 0 ? xmax * 1.05 : 1, 1.0};
  std::ostringstream o;
  o << svg_open(W, H, "Latency CDF per model (successful requests)");
  axes(o, f, "latency from scheduled arrival (s)", "fraction of requests");
  for (size_t m = 0; m < models.size(); ++m) {
    auto& xs = lat[m];
    std::sort(xs.begin(), xs.end());
    if (!xs.empty()) {
      o << fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="2" points=")", color(m));
      // A step curve, thinned to at most ~2000 points.
      size_t stride = std::max<size_t>(1, xs.size() / 1000);
      double prev_y = 0;
      for (size_t i = 0; i < xs.size(); i += stride) {
        double y = static_cast<double>(i + 1) / static_cast<double>(xs.size());
        o << fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", f.px(xs[i]), f.py(prev_y), f.px(xs[i]),
                         f.py(y));
        prev_y = y;
      }
      o << fmt::format("{:.1f},{:.1f}", f.px(xs.back()), f.py(1.0)) << "\"/>\n";
    }
    // The legend sits inside the plot area, at the bottom right where a CDF leaves room,
    // its labels cut to the area's width (they ran past the picture's right edge).
    const double lx = f.x0 + f.w * 0.45, row = 18;
    const double ly = f.y0 + f.h - 10 - row * static_cast<double>(models.size() - m) + 12;
    auto label = fmt::format("{} (n={}, p99 {:.3f} s)", models[m], xs.size(), percentile(xs, 0.99));
    const auto fit = static_cast<size_t>((f.x0 + f.w - lx - 30) / 7.0);
    if (label.size() > fit) label = label.substr(0, fit - 1) + "~";
    o << fmt::format(
        R"(<rect x="{:.1f}" y="{:.1f}" width="14" height="4" fill="{}"/><text x="{:.1f}" y="{:.1f}" font-size="12">{}</text>)"
        "\n",
        lx + 4, ly - 4, color(m), lx + 22, ly, esc(label));
  }
  o << "</svg>\n";
  return o.str();
}

std::string timeline_svg(const std::vector<std::string>& models,
                         const std::vector<request_record>& records,
                         const std::vector<swap_event>& swaps) {
  const int W = 1000;
  std::vector<int32_t> devices;
  for (auto& e : swaps)
    if (std::find(devices.begin(), devices.end(), e.device) == devices.end())
      devices.push_back(e.device);
  std::sort(devices.begin(), devices.end());
  const double lane = 22;
  const int H = static_cast<int>(420 + lane * static_cast<double>(devices.size()));
  double tmax = 0, lmax = 0;
  for (auto& r : records)
    if (r.sent()) {
      tmax = std::max(tmax, r.done_s);
      if (r.ok()) lmax = std::max(lmax, r.latency_s());
    }
  for (auto& e : swaps) tmax = std::max(tmax, e.start_s + e.seconds);
  frame top{70, 40, W - 250.0, 260, tmax > 0 ? tmax * 1.02 : 1, lmax > 0 ? lmax * 1.1 : 1};
  frame bottom{70,        340,
               W - 250.0, lane * static_cast<double>(std::max<size_t>(devices.size(), 1)),
               top.xmax,  1};
  std::ostringstream o;
  o << svg_open(W, H, "Requests (latency by arrival time) and swaps per device");
  axes(o, top, "", "latency (s)");
  size_t failed = 0;
  for (auto& r : records) {
    if (!r.sent()) continue;
    auto it = std::find(models.begin(), models.end(), r.model);
    auto m = static_cast<size_t>(it - models.begin());
    if (r.ok()) {
      o << fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="2" fill="{}" fill-opacity="0.7"/>)",
                       top.px(r.arrival_s), top.py(r.latency_s()), color(m));
    } else {
      ++failed;
      double x = top.px(r.arrival_s), y = top.y0 + 6;
      o << fmt::format(
          R"(<path d="M{:.1f},{:.1f} l6,6 m0,-6 l-6,6" stroke="#d00" stroke-width="1.5"/>)", x - 3,
          y - 3);
    }
    o << '\n';
  }
  axes(o, bottom, "time since the start of the run (s)", "", false);
  for (size_t d = 0; d < devices.size(); ++d) {
    double y = bottom.y0 + lane * static_cast<double>(d);
    o << fmt::format(R"(<text x="{}" y="{:.1f}" font-size="11" text-anchor="end">device {}</text>)"
                     "\n",
                     bottom.x0 - 4, y + lane / 2 + 4, devices[d]);
    for (auto& e : swaps) {
      if (e.device != devices[d]) continue;
      auto it = std::find(models.begin(), models.end(), e.model);
      auto m = static_cast<size_t>(it - models.begin());
      double x = bottom.px(e.start_s);
      if (e.load) {
        double w = std::max(1.0, bottom.px(e.start_s + e.seconds) - x);
        o << fmt::format(
            R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="{}"><title>load {} {:.3f} s</title></rect>)"
            "\n",
            x, y + 3, w, lane - 6, color(m), esc(e.model), e.seconds);
      } else {
        o << fmt::format(
            R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{0:.1f}" y2="{2:.1f}" stroke="#000"><title>evict {3}</title></line>)"
            "\n",
            x, y + 2, y + lane - 2, esc(e.model));
      }
    }
  }
  for (size_t m = 0; m < models.size(); ++m) {
    double ly = 50 + 20.0 * static_cast<double>(m);
    o << fmt::format(
        R"(<circle cx="{}" cy="{}" r="5" fill="{}"/><text x="{}" y="{}" font-size="12">{}</text>)"
        "\n",
        W - 165, ly - 4, color(m), W - 152, ly, esc(models[m]));
  }
  double ly = 50 + 20.0 * static_cast<double>(models.size()) + 10;
  o << fmt::format(
      R"(<text x="{0}" y="{1}" font-size="11">bars: shard loads</text>)"
      "\n"
      R"(<text x="{0}" y="{2}" font-size="11">black ticks: evictions</text>)"
      "\n"
      R"(<text x="{0}" y="{3}" font-size="11" fill="#d00">x: failed requests ({4})</text>)"
      "\n",
      W - 170, ly, ly + 16, ly + 32, failed);
  o << "</svg>\n";
  return o.str();
}

caf::error write_report(const std::string& dir, const run_summary& s,
                        const std::vector<request_record>& records,
                        const std::vector<swap_event>& swaps, const std::string& extra) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return make_error(ec::io_error, "cannot create report folder " + dir + ": " + ec.message());
  auto put = [&](const std::string& name, const std::string& text) -> caf::error {
    auto path = (fs::path{dir} / name).string();
    std::ofstream out{path};
    out << text;
    out.close();
    if (!out) return make_error(ec::io_error, "cannot write " + path);
    return {};
  };
  std::ostringstream csv;
  csv << "index,model,arrival_s,sent_s,done_s,latency_s,status,error_kind,swapped,queue_ms,"
         "load_ms,compute_ms\n";
  for (size_t i = 0; i < records.size(); ++i) {
    auto& r = records[i];
    csv << fmt::format("{},{},{:.6f},{:.6f},{:.6f},{:.6f},{},{},{},{:.3f},{:.3f},{:.3f}\n", i,
                       r.model, r.arrival_s, r.sent_s, r.done_s, r.sent() ? r.latency_s() : -1.0,
                       r.status, r.error_kind, r.swapped ? 1 : 0, r.queue_ms, r.load_ms,
                       r.compute_ms);
  }
  caf::error err;
  if ((err = put("summary.json", to_json(s, extra) + "\n")) ||
      (err = put("requests.csv", csv.str())) ||
      (err = put("latency_cdf.svg", latency_cdf_svg(s.models, records))) ||
      (err = put("timeline.svg", timeline_svg(s.models, records, swaps))))
    return err;
  return {};
}

}  // namespace computron::workload
