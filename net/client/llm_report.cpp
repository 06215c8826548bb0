#include "net/client/llm_report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/error.hpp"
#include "net/client/llm_loadgen.hpp"
#include "workload/stats.hpp"

namespace computron::net {

namespace {

constexpr double char_px = 6.6;  // an 11-px sans-serif character, generously
constexpr double line_px = 16;
constexpr double swatch_px = 26;  // the colour sample and its gap before the text

const char* palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                         "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

const char* color(size_t i) {
  return palette[i % (sizeof(palette) / sizeof(palette[0]))];
}

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else if (c == '&')
      out += "&amp;";
    else if (c == '"')
      out += "&quot;";
    else
      out += c;
  }
  return out;
}

/// Round steps (1, 2, 5 x 10^k) giving about `n` ticks over [0, hi].
std::vector<double> ticks(double hi, int n) {
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

std::string number(double v) {
  auto s = fmt::format("{:.3f}", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

struct frame {
  double x0, y0, w, h, xmax;
  double px(double x) const { return x0 + w * std::clamp(x / xmax, 0.0, 1.0); }
  double py(double y) const { return y0 + h - h * std::clamp(y, 0.0, 1.0); }
};

void axes(std::ostringstream& o, const frame& f, const std::string& title,
          const std::string& xlabel) {
  o << fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#333"/>)"
                   "\n",
                   f.x0, f.y0, f.w, f.h);
  for (double t : ticks(f.xmax, 5))
    o << fmt::format(
        R"(<line x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}" stroke="#ddd"/><text x="{0:.1f}" y="{3}" font-size="11" text-anchor="middle">{4}</text>)"
        "\n",
        f.px(t), f.y0, f.y0 + f.h, f.y0 + f.h + 14, number(t));
  for (double t : {0.0, 0.25, 0.5, 0.75, 1.0})
    o << fmt::format(
        R"(<line x1="{0}" y1="{1:.1f}" x2="{2}" y2="{1:.1f}" stroke="#ddd"/><text x="{3}" y="{4:.1f}" font-size="11" text-anchor="end">{5}</text>)"
        "\n",
        f.x0, f.py(t), f.x0 + f.w, f.x0 - 4, f.py(t) + 4, number(t));
  o << fmt::format(R"(<text x="{}" y="{}" font-size="13" text-anchor="middle">{}</text>)"
                   "\n",
                   f.x0 + f.w / 2, f.y0 - 8, esc(title));
  o << fmt::format(R"(<text x="{}" y="{}" font-size="11" text-anchor="middle">{}</text>)"
                   "\n",
                   f.x0 + f.w / 2, f.y0 + f.h + 30, esc(xlabel));
}

/// A step curve of the sorted sample, thinned to about 1000 steps.
void cdf_curve(std::ostringstream& o, const frame& f, std::vector<double> xs, const char* stroke,
               double width) {
  if (xs.empty()) return;
  std::sort(xs.begin(), xs.end());
  o << fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="{}" points=")", stroke,
                   width);
  const size_t stride = std::max<size_t>(1, xs.size() / 1000);
  double prev = 0;
  for (size_t i = 0; i < xs.size(); i += stride) {
    double y = static_cast<double>(i + 1) / static_cast<double>(xs.size());
    o << fmt::format("{:.1f},{:.1f} {:.1f},{:.1f} ", f.px(xs[i]), f.py(prev), f.px(xs[i]), f.py(y));
    prev = y;
  }
  o << fmt::format("{:.1f},{:.1f}", f.px(xs.back()), f.py(1.0)) << "\"/>\n";
}

/// One metric's samples in milliseconds, per model, over the successes.
std::vector<std::vector<double>> samples_ms(const llm_summary& s,
                                            const std::vector<stream_record>& records, int metric) {
  std::vector<std::vector<double>> out(s.models.size());
  for (auto& r : records) {
    if (!r.ok()) continue;
    auto it = std::find(s.models.begin(), s.models.end(), r.model);
    if (it == s.models.end()) continue;
    auto& xs = out[static_cast<size_t>(it - s.models.begin())];
    if (metric == 0) xs.push_back(r.ttft_s() * 1e3);
    if (metric == 1)
      if (auto t = r.tpot_s()) xs.push_back(*t * 1e3);
    if (metric == 2)
      for (auto g : r.itl_s()) xs.push_back(g * 1e3);
    if (metric == 3) xs.push_back(r.e2e_s() * 1e3);
  }
  return out;
}

void panel(std::ostringstream& o, const frame& at, const llm_summary& s,
           const std::vector<stream_record>& records, int metric, const char* title) {
  auto per = samples_ms(s, records, metric);
  std::vector<double> all;
  for (auto& xs : per) all.insert(all.end(), xs.begin(), xs.end());
  frame f = at;
  f.xmax = all.empty() ? 1 : *std::max_element(all.begin(), all.end()) * 1.05;
  if (!(f.xmax > 0)) f.xmax = 1;
  axes(o, f, title, "milliseconds");
  const bool several = s.models.size() > 1;
  for (size_t m = 0; m < per.size(); ++m) cdf_curve(o, f, per[m], color(m), 2);
  if (several) cdf_curve(o, f, all, "#000", 1.2);
  // The percentiles of all requests, as the printed report gives them.
  size_t k = 0;
  for (auto p : s.percentiles) {
    if (all.empty()) break;
    double v = workload::percentile(all, p / 100);
    o << fmt::format(
        R"(<line x1="{0:.1f}" y1="{1}" x2="{0:.1f}" y2="{2}" stroke="#555" stroke-dasharray="4,3"/><text x="{3:.1f}" y="{4:.1f}" font-size="10" fill="#333" stroke="white" stroke-width="3" paint-order="stroke">{5} {6:.1f} ms</text>)"
        "\n",
        f.px(v), f.y0, f.y0 + f.h, std::min(f.px(v) + 3, f.x0 + f.w - 90),
        f.y0 + 12 + 12.0 * static_cast<double>(k++), percentile_name(p), v);
  }
  std::vector<std::pair<std::string, const char*>> entries;
  for (size_t m = 0; m < per.size(); ++m)
    entries.emplace_back(fmt::format("{} (n={})", s.models[m], per[m].size()), color(m));
  if (several) entries.emplace_back(fmt::format("all (n={})", all.size()), "#000");
  entries.emplace_back("percentiles of all", nullptr);
  size_t longest = 0;
  for (auto& e : entries) longest = std::max(longest, e.first.size());
  auto box = place_legend(f.x0, f.y0, f.w, f.h, entries.size(), longest);
  o << fmt::format(
      R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="white" fill-opacity="0.9" stroke="#999"/>)"
      "\n",
      box.x, box.y, box.w, box.h);
  for (size_t i = 0; i < entries.size(); ++i) {
    double y = box.y + 6 + line_px * static_cast<double>(i) + 11;
    auto label = entries[i].first;
    if (label.size() > box.max_chars) label = label.substr(0, box.max_chars - 1) + "~";
    if (entries[i].second)
      o << fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="16" height="4" fill="{}"/>)",
                       box.x + 6, y - 5, entries[i].second);
    else  // the percentile markers' dashed line
      o << fmt::format(
          R"(<line x1="{0:.1f}" y1="{1:.1f}" x2="{2:.1f}" y2="{1:.1f}" stroke="#555" stroke-dasharray="4,3"/>)",
          box.x + 6, y - 3, box.x + 22);
    o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="11">{}</text>)"
                     "\n",
                     box.x + swatch_px, y, esc(label));
  }
}

}  // namespace

legend_box place_legend(double x0, double y0, double w, double h, size_t entries,
                        size_t longest_chars) {
  constexpr double margin = 8;
  legend_box b;
  const double room = std::max(0.0, w - 2 * margin - swatch_px - 6);
  b.max_chars = std::max<size_t>(4, static_cast<size_t>(room / char_px));
  const size_t chars = std::min(longest_chars, b.max_chars);
  b.w = std::min(w - 2 * margin, swatch_px + 6 + char_px * static_cast<double>(chars));
  b.h = std::min(h - 2 * margin, 12 + line_px * static_cast<double>(entries));
  b.x = x0 + w - margin - b.w;
  b.y = y0 + h - margin - b.h;
  return b;
}

std::string llm_cdf_svg(const llm_summary& s, const std::vector<stream_record>& records) {
  const int W = 1100, H = 820;
  std::ostringstream o;
  o << fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" font-family="sans-serif">)"
      "\n"
      R"(<rect width="{0}" height="{1}" fill="white"/><text x="{2}" y="24" font-size="15" text-anchor="middle">{3}</text>)"
      "\n",
      W, H, W / 2,
      esc(fmt::format("Latency CDFs of {} successful requests (fraction of requests)",
                      s.overall.ok)));
  const char* titles[] = {"Time to first token (TTFT)", "Time per output token (TPOT)",
                          "Inter-token latency (ITL)", "End-to-end latency (E2EL)"};
  for (int m = 0; m < 4; ++m) {
    const double px = (m % 2) * (W / 2.0), py = 40 + (m / 2) * ((H - 40) / 2.0);
    frame f{px + 60, py + 30, W / 2.0 - 90, (H - 40) / 2.0 - 80, 1};
    panel(o, f, s, records, m, titles[m]);
  }
  o << "</svg>\n";
  return o.str();
}

caf::error write_llm_report(const std::string& dir, const llm_summary& s,
                            const std::vector<stream_record>& records,
                            const std::vector<workload::device_traffic>& devices,
                            const std::vector<workload::swap_event>& swaps,
                            const std::string& extra) {
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
  csv << "index,model,arrival_s,sent_s,done_s,ttft_s,tpot_s,e2e_s,prompt_tokens,output_tokens,"
         "chunks,status,error_kind\n";
  for (size_t i = 0; i < records.size(); ++i) {
    auto& r = records[i];
    auto tpot = r.tpot_s();
    csv << fmt::format("{},{},{:.6f},{:.6f},{:.6f},{:.6f},{},{:.6f},{},{},{},{},{}\n", i, r.model,
                       r.arrival_s, r.sent_s, r.done_s, r.sent() ? r.ttft_s() : -1.0,
                       tpot && r.ok() ? fmt::format("{:.6f}", *tpot) : std::string{},
                       r.sent() ? r.e2e_s() : -1.0, r.prompt_tokens, r.output_tokens,
                       r.chunk_s.size(), r.status, r.error_kind);
  }
  caf::error err;
  if ((err = put("summary.json", llm_json(s, devices, extra) + "\n")) ||
      (err = put("requests.csv", csv.str())) ||
      (err = put("llm_cdf.svg", llm_cdf_svg(s, records))) ||
      (err = put("timeline.svg",
                 workload::timeline_svg(s.models, as_request_records(records), swaps))))
    return err;
  return {};
}

}  // namespace computron::net
