#pragma once

#include <cstdint>
#include <istream>
#include <random>
#include <string>
#include <vector>

#include <caf/expected.hpp>

#include "workload/arrivals.hpp"

/// Prompt and output lengths of an LLM benchmark (`computron loadgen`): drawn from a
/// distribution (fixed, uniform, lognormal) or from the rows of a CSV of measured pairs, as
/// `vllm bench serve` draws its random and ShareGPT datasets. Plain functions, seeded, so
/// the same flags give the same requests.
namespace computron::net {

enum class length_kind { fixed, uniform, lognormal };

/// "fixed", "uniform", "lognormal".
std::string to_string(length_kind k);

/// A distribution of lengths in tokens with mean `mean`.
struct length_dist {
  length_kind kind = length_kind::fixed;
  double mean = 1;
  /// uniform: lengths over [mean (1 - spread), mean (1 + spread)], spread in 0..1 (vLLM's
  /// range ratio); lognormal: the coefficient of variation (standard deviation / mean).
  double spread = 0;
};

/// Parses "fixed", "uniform:SPREAD" or "lognormal:SPREAD" around `mean`. `flag` names the
/// flag in errors (invalid_request): an unknown kind, a spread that is missing, not a
/// number or out of range, a mean under 1.
caf::expected<length_dist> parse_length_dist(const std::string& spec, int64_t mean,
                                             const std::string& flag);

/// One length, rounded to a whole number of tokens and at least 1. The lognormal's
/// parameters are chosen so that its mean is `mean` and its CV `spread`.
int64_t draw_length(const length_dist& d, std::mt19937_64& rng);

struct length_pair {
  int64_t prompt_len = 0;
  int64_t output_len = 0;
};

/// Reads CSV lines `prompt_len,output_len` (an optional header line starting with a
/// letter, blank lines and `#` comments ignored). Errors name the source and the line: a
/// number that is not a whole number of at least 1, a wrong column count, no rows.
caf::expected<std::vector<length_pair>> parse_length_pairs(std::istream& in,
                                                           const std::string& source);
caf::expected<std::vector<length_pair>> read_length_pairs(const std::string& path);

/// Where a run's lengths come from: the rows of a CSV (each request draws one at random)
/// when there are any, else the two distributions.
struct length_source {
  length_dist prompt;
  length_dist output;
  std::vector<length_pair> rows;
};

/// Gives every arrival without lengths of its own (a trace may give them) a prompt and
/// an output length from `src`. Deterministic for a seed.
void assign_lengths(workload::schedule& s, const length_source& src, uint64_t seed);

/// Shortens a request to fit a context of `max_len` positions (prompt + output), taking
/// from the prompt first and keeping at least one token of each; false when nothing had to
/// change. A `max_len` of 0 or less means no limit.
bool fit_lengths(int64_t& prompt_len, int64_t& output_len, int64_t max_len);

}  // namespace computron::net
