#include "net/client/llm_lengths.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "common/error.hpp"
#include "common/numbered_lines.hpp"

namespace computron::net {

namespace {

caf::error bad(std::string why) {
  return make_error(ec::invalid_request, std::move(why));
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

/// A whole number of at least 1, the whole text.
bool parse_length(const std::string& text, int64_t& out) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) return false;
  try {
    size_t used = 0;
    auto v = std::stoll(text, &used);
    if (used != text.size() || v < 1) return false;
    out = v;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

std::string to_string(length_kind k) {
  switch (k) {
    case length_kind::fixed:
      return "fixed";
    case length_kind::uniform:
      return "uniform";
    case length_kind::lognormal:
      return "lognormal";
  }
  return "?";
}

caf::expected<length_dist> parse_length_dist(const std::string& spec, int64_t mean,
                                             const std::string& flag) {
  const auto usage = flag + " takes fixed, uniform:SPREAD or lognormal:SPREAD";
  if (mean < 1) return bad(fmt::format("{}: the mean length {} is under 1", flag, mean));
  length_dist d;
  d.mean = static_cast<double>(mean);
  auto colon = spec.find(':');
  auto kind = spec.substr(0, colon);
  if (kind == "fixed") {
    if (colon != std::string::npos) return bad(flag + ": fixed takes no spread; " + usage);
    return d;
  }
  if (kind == "uniform")
    d.kind = length_kind::uniform;
  else if (kind == "lognormal")
    d.kind = length_kind::lognormal;
  else
    return bad(flag + ": unknown distribution '" + kind + "'; " + usage);
  if (colon == std::string::npos) return bad(flag + ": " + kind + " needs a spread; " + usage);
  auto text = spec.substr(colon + 1);
  try {
    size_t used = 0;
    d.spread = std::stod(text, &used);
    if (used != text.size()) d.spread = NAN;
  } catch (const std::exception&) {
    d.spread = NAN;
  }
  // uniform's spread past 1 would ask for negative lengths; a lognormal's CV past 10
  // puts nearly every draw at 1 token and a few at tens of thousands.
  const double most = d.kind == length_kind::uniform ? 1.0 : 10.0;
  if (!(d.spread >= 0 && d.spread <= most))
    return bad(
        fmt::format("{}: spread '{}' of {} must be a number in 0..{}", flag, text, kind, most));
  return d;
}

int64_t draw_length(const length_dist& d, std::mt19937_64& rng) {
  double x = d.mean;
  if (d.kind == length_kind::uniform && d.spread > 0) {
    auto lo = static_cast<int64_t>(std::llround(d.mean * (1 - d.spread)));
    auto hi = static_cast<int64_t>(std::llround(d.mean * (1 + d.spread)));
    x = static_cast<double>(std::uniform_int_distribution<int64_t>{std::max<int64_t>(lo, 1),
                                                                   std::max<int64_t>(hi, 1)}(rng));
  } else if (d.kind == length_kind::lognormal && d.spread > 0) {
    // mean = exp(mu + sigma^2 / 2), CV^2 = exp(sigma^2) - 1.
    const double sigma2 = std::log1p(d.spread * d.spread);
    const double mu = std::log(d.mean) - sigma2 / 2;
    x = std::lognormal_distribution<double>{mu, std::sqrt(sigma2)}(rng);
  }
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(x)));
}

caf::expected<std::vector<length_pair>> parse_length_pairs(std::istream& in,
                                                           const std::string& source) {
  std::vector<length_pair> out;
  numbered_lines lines{in, source};
  auto fail = [&](const std::string& why) { return lines.fail(why); };
  while (lines.next()) {
    auto text = trim(lines.line());
    if (text.empty() || text[0] == '#') continue;
    if (out.empty() && std::isalpha(static_cast<unsigned char>(text[0]))) continue;  // header
    std::vector<std::string> cols;
    std::stringstream ss{text};
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(trim(c));
    if (text.back() == ',') cols.emplace_back();
    if (cols.size() != 2)
      return fail(fmt::format("{} columns; expected prompt_len,output_len", cols.size()));
    length_pair p;
    if (!parse_length(cols[0], p.prompt_len))
      return fail("prompt_len '" + cols[0] + "' is not a whole number of at least 1");
    if (!parse_length(cols[1], p.output_len))
      return fail("output_len '" + cols[1] + "' is not a whole number of at least 1");
    out.push_back(p);
  }
  if (auto err = lines.read_error()) return err;
  if (out.empty()) return bad(source + " has no rows of prompt_len,output_len");
  return out;
}

caf::expected<std::vector<length_pair>> read_length_pairs(const std::string& path) {
  std::ifstream in{path};
  if (!in) return bad("cannot open lengths file " + path);
  return parse_length_pairs(in, path);
}

void assign_lengths(workload::schedule& s, const length_source& src, uint64_t seed) {
  // Its own stream: the arrivals' seed must not shift when lengths are drawn too.
  std::mt19937_64 rng{seed ^ 0x6c656e67746873ULL};
  std::uniform_int_distribution<size_t> row(0, src.rows.empty() ? 0 : src.rows.size() - 1);
  for (auto& a : s.arrivals) {
    length_pair p;
    if (!src.rows.empty()) {
      p = src.rows[row(rng)];
    } else {
      p.prompt_len = draw_length(src.prompt, rng);
      p.output_len = draw_length(src.output, rng);
    }
    if (a.prompt_len <= 0) a.prompt_len = p.prompt_len;
    if (a.max_tokens <= 0) a.max_tokens = p.output_len;
  }
}

bool fit_lengths(int64_t& prompt_len, int64_t& output_len, int64_t max_len) {
  if (max_len <= 0 || prompt_len + output_len <= max_len) return false;
  const auto room = std::max<int64_t>(max_len, 2);
  output_len = std::min(output_len, room - 1);
  prompt_len = std::max<int64_t>(1, std::min(prompt_len, room - output_len));
  return true;
}

}  // namespace computron::net
