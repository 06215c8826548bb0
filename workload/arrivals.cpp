#include "workload/arrivals.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.hpp"
#include "common/numbered_lines.hpp"

namespace computron::workload {

namespace {

caf::error bad(const std::string& what) {
  return make_error(ec::invalid_request, what);
}

bool finite_non_negative(double x) {
  return std::isfinite(x) && x >= 0;
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  auto e = s.find_last_not_of(" \t\r");
  return s.substr(b, e - b + 1);
}

/// Parses all of `text` as a number; false on trailing garbage, empty text or overflow.
bool parse_double(const std::string& text, double& out) {
  if (text.empty()) return false;
  try {
    size_t used = 0;
    out = std::stod(text, &used);
    return used == text.size() && std::isfinite(out);
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_int(const std::string& text, int64_t& out) {
  if (text.empty()) return false;
  try {
    size_t used = 0;
    out = std::stoll(text, &used);
    return used == text.size();
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

gamma_gaps::gamma_gaps(double rate, double cv, uint64_t seed)
    : period_(cv == 0 ? 1.0 / rate : 0),
      rng_(seed),
      gamma_(cv == 0 ? 1.0 : 1.0 / (cv * cv), cv == 0 ? 1.0 : cv * cv / rate) {}

caf::expected<gamma_gaps> gamma_gaps::make(double rate, double cv, uint64_t seed) {
  if (!(std::isfinite(rate) && rate > 0))
    return bad(fmt::format("rate must be a positive number, not {}", rate));
  if (!finite_non_negative(cv)) return bad(fmt::format("cv must be 0 or more, not {}", cv));
  return gamma_gaps{rate, cv, seed};
}

double gamma_gaps::next() {
  return period_ > 0 ? period_ : gamma_(rng_);
}

caf::expected<std::vector<double>> gamma_arrivals(double rate, double cv, double start_s,
                                                  double duration_s, uint64_t seed) {
  if (!finite_non_negative(duration_s))
    return bad(fmt::format("duration must be 0 or more seconds, not {}", duration_s));
  if (!finite_non_negative(rate)) return bad(fmt::format("rate must be 0 or more, not {}", rate));
  std::vector<double> out;
  if (rate == 0) return out;
  auto gaps = gamma_gaps::make(rate, cv, seed);
  if (!gaps) return gaps.error();
  const double end = start_s + duration_s;
  for (double t = start_s + gaps->next(); t < end; t += gaps->next()) out.push_back(t);
  return out;
}

caf::expected<std::vector<double>> power_law_rates(size_t n, double total_rate, double alpha) {
  if (n == 0) return bad("a power law needs at least one model");
  if (!finite_non_negative(total_rate))
    return bad(fmt::format("the total rate must be 0 or more, not {}", total_rate));
  if (!finite_non_negative(alpha))
    return bad(fmt::format("the power-law alpha must be 0 or more, not {}", alpha));
  std::vector<double> w(n);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += w[i] = std::pow(static_cast<double>(i + 1), -alpha);
  for (auto& x : w) x = total_rate * x / sum;
  return w;
}

caf::expected<std::vector<double>> uniform_rates(size_t n, double total_rate) {
  return power_law_rates(n, total_rate, 0.0);
}

uint64_t model_seed(uint64_t seed, size_t model_index) {
  // splitmix64 of the pair: nearby seeds and indices give unrelated streams.
  uint64_t z = seed * 0x9e3779b97f4a7c15ull +
               (static_cast<uint64_t>(model_index) + 1) * 0xd1b54a32d192ed03ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

caf::expected<schedule> generate(const gamma_workload& w) {
  if (w.models.empty()) return bad("no models given");
  if (w.rates.size() != w.models.size())
    return bad(fmt::format("{} rates for {} models: give one rate per model", w.rates.size(),
                           w.models.size()));
  std::set<std::string> seen;
  for (auto& m : w.models) {
    if (m.empty()) return bad("an empty model name");
    if (!seen.insert(m).second) return bad("model " + m + " is named twice");
  }
  for (size_t i = 0; i < w.rates.size(); ++i)
    if (!finite_non_negative(w.rates[i]))
      return bad(fmt::format("the rate of {} must be 0 or more, not {}", w.models[i], w.rates[i]));
  if (!finite_non_negative(w.cv)) return bad(fmt::format("cv must be 0 or more, not {}", w.cv));
  if (!(std::isfinite(w.duration_s) && w.duration_s > 0))
    return bad(
        fmt::format("the duration must be a positive number of seconds, not {}", w.duration_s));
  schedule s;
  s.models = w.models;
  s.duration_s = w.duration_s;
  for (size_t i = 0; i < w.models.size(); ++i) {
    auto times = gamma_arrivals(w.rates[i], w.cv, 0, w.duration_s, model_seed(w.seed, i));
    if (!times) return times.error();
    for (auto t : *times) s.arrivals.push_back({t, static_cast<uint32_t>(i), 0, 0});
  }
  std::stable_sort(s.arrivals.begin(), s.arrivals.end(),
                   [](const arrival& a, const arrival& b) { return a.time_s < b.time_s; });
  return s;
}

caf::expected<schedule> parse_trace(std::istream& in, const std::string& source) {
  schedule s;
  numbered_lines lines{in, source};
  auto fail = [&](const std::string& why) { return lines.fail(why); };
  while (lines.next()) {
    auto text = trim(lines.line());
    if (text.empty() || text[0] == '#') continue;
    std::vector<std::string> cols;
    std::stringstream ss{text};
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(trim(c));
    if (!text.empty() && text.back() == ',') cols.emplace_back();
    if (s.arrivals.empty() && !cols.empty() && cols[0].rfind("time", 0) == 0) continue;  // header
    if (cols.size() < 2) return fail("expected time_s,model[,prompt_len[,max_tokens]]");
    if (cols.size() > 4) return fail(fmt::format("{} columns; at most 4", cols.size()));
    arrival a;
    if (!parse_double(cols[0], a.time_s) || a.time_s < 0)
      return fail("time '" + cols[0] + "' is not a number of seconds >= 0");
    if (cols[1].empty()) return fail("the model name is empty");
    if (cols.size() > 2 && !cols[2].empty() &&
        (!parse_int(cols[2], a.prompt_len) || a.prompt_len < 1))
      return fail("prompt_len '" + cols[2] + "' is not a positive integer");
    if (cols.size() > 3 && !cols[3].empty() &&
        (!parse_int(cols[3], a.max_tokens) || a.max_tokens < 1))
      return fail("max_tokens '" + cols[3] + "' is not a positive integer");
    auto it = std::find(s.models.begin(), s.models.end(), cols[1]);
    a.model = static_cast<uint32_t>(it - s.models.begin());
    if (it == s.models.end()) s.models.push_back(cols[1]);
    s.arrivals.push_back(a);
  }
  if (auto err = lines.read_error()) return err;
  if (s.arrivals.empty()) return bad(source + " has no arrivals");
  std::stable_sort(s.arrivals.begin(), s.arrivals.end(),
                   [](const arrival& a, const arrival& b) { return a.time_s < b.time_s; });
  s.duration_s = std::nextafter(s.arrivals.back().time_s, HUGE_VAL);
  return s;
}

caf::expected<schedule> read_trace(const std::string& path) {
  std::ifstream in{path};
  if (!in) return make_error(ec::io_error, "cannot open trace " + path);
  return parse_trace(in, path);
}

void write_trace(std::ostream& out, const schedule& s) {
  out << "time_s,model,prompt_len,max_tokens\n";
  for (auto& a : s.arrivals) {
    out << fmt::format("{:.6f},{},", a.time_s, s.models[a.model]);
    if (a.prompt_len > 0) out << a.prompt_len;
    out << ',';
    if (a.max_tokens > 0) out << a.max_tokens;
    out << '\n';
  }
}

caf::error check_models(const schedule& s, const std::vector<std::string>& known) {
  std::vector<std::string> unknown;
  for (auto& m : s.models)
    if (std::find(known.begin(), known.end(), m) == known.end()) unknown.push_back(m);
  if (unknown.empty()) return {};
  return make_error(
      ec::unknown_model,
      fmt::format("unknown model{} {} (the server has: {})", unknown.size() > 1 ? "s" : "",
                  fmt::join(unknown, ", "),
                  known.empty() ? std::string{"none"} : fmt::format("{}", fmt::join(known, ", "))));
}

caf::expected<std::vector<std::string>> split_list(const std::string& text,
                                                   const std::string& what) {
  std::vector<std::string> out;
  std::stringstream ss{text};
  for (std::string part; std::getline(ss, part, ',');) {
    part = trim(part);
    if (part.empty()) return bad(what + " has an empty entry: '" + text + "'");
    out.push_back(part);
  }
  if (!text.empty() && text.back() == ',') return bad(what + " has an empty entry: '" + text + "'");
  if (out.empty()) return bad(what + " is empty");
  return out;
}

caf::expected<std::vector<double>> parse_numbers(const std::string& text, const std::string& what) {
  auto parts = split_list(text, what);
  if (!parts) return parts.error();
  std::vector<double> out;
  for (auto& p : *parts) {
    double x = 0;
    if (!parse_double(p, x)) return bad(what + ": '" + p + "' is not a number");
    out.push_back(x);
  }
  return out;
}

}  // namespace computron::workload
