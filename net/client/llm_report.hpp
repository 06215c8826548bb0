#pragma once

#include <string>
#include <vector>

#include <caf/error.hpp>

#include "net/client/llm_metrics.hpp"
#include "workload/report.hpp"

/// The LLM report's folder and picture. The picture: one CDF panel per metric (TTFT, TPOT, ITL,
/// E2EL) over the successful requests, a curve per model, the chosen percentiles of all requests
/// marked and labelled as `vllm bench serve` prints them, and each panel's legend drawn inside its
/// plot area (where a CDF leaves room: below the curves, at the right).
namespace computron::net {

/// An SVG document.
std::string llm_cdf_svg(const llm_summary& s, const std::vector<stream_record>& records);

/// Writes summary.json (llm_json), requests.csv (one line per request: times, TTFT, TPOT,
/// E2EL, tokens, status), llm_cdf.svg and timeline.svg (requests by due time and every
/// swap per device) into `dir` (created). Errors: io_error naming the file.
caf::error write_llm_report(const std::string& dir, const llm_summary& s,
                            const std::vector<stream_record>& records,
                            const std::vector<workload::device_traffic>& devices,
                            const std::vector<workload::swap_event>& swaps,
                            const std::string& extra = {});

/// Where a legend of `entries` lines, the longest `longest_chars` characters, goes inside
/// a plot area (x0, y0, w, h): its box (x, y, w, h), kept within the area however long the
/// labels (they are cut to fit).
struct legend_box {
  double x = 0, y = 0, w = 0, h = 0;
  /// Characters of a label that fit.
  size_t max_chars = 0;
};
legend_box place_legend(double x0, double y0, double w, double h, size_t entries,
                        size_t longest_chars);

}  // namespace computron::net
