#pragma once

#include <cstdint>
#include <istream>
#include <random>
#include <string>
#include <vector>

#include <caf/expected.hpp>

/// Arrival processes of the reference workloads (WORKLOADS.md): per-model Gamma renewal
/// processes with skewed rates, and replay of recorded traces. Shared by `computron
/// loadgen`, the experiments and the simulator, so the same seed means the same requests
/// everywhere. Torch-free, actor-free.
namespace computron::workload {

/// One request of a workload.
struct arrival {
  /// Seconds from the start of the run.
  double time_s = 0;
  /// Index into schedule::models.
  uint32_t model = 0;
  /// Prompt tokens and tokens to generate; 0 means "the run's default".
  int64_t prompt_len = 0;
  int64_t max_tokens = 0;
};

/// A whole workload: the models it names and its arrivals in time order.
struct schedule {
  std::vector<std::string> models;
  std::vector<arrival> arrivals;
  /// Arrivals stop before this (for a trace: just past the last arrival).
  double duration_s = 0;
};

/// Gaps of a Gamma renewal process: shape 1/cv^2, scale cv^2/rate, so the mean gap is
/// 1/rate and the gaps' coefficient of variation is cv (cv 1 is Poisson, cv 4 bursty,
/// cv 0 a fixed period). Deterministic for a seed.
class gamma_gaps {
 public:
  /// Errors: rate not positive or cv negative (invalid_request).
  static caf::expected<gamma_gaps> make(double rate, double cv, uint64_t seed);

  double next();

 private:
  gamma_gaps(double rate, double cv, uint64_t seed);
  double period_;  // cv 0: every gap is 1/rate
  std::mt19937_64 rng_;
  std::gamma_distribution<double> gamma_;
};

/// Arrival times of one Gamma process: start + first gap, then gap after gap, stopping
/// before start + duration. A rate of 0 gives none.
caf::expected<std::vector<double>> gamma_arrivals(double rate, double cv, double start_s,
                                                  double duration_s, uint64_t seed);

/// rate_i = total * (i+1)^-alpha / sum_j (j+1)^-alpha for i in 0..n-1 (AlpaServe uses
/// alpha 0.5); alpha 0 is uniform.
caf::expected<std::vector<double>> power_law_rates(size_t n, double total_rate, double alpha);

/// total / n each.
caf::expected<std::vector<double>> uniform_rates(size_t n, double total_rate);

/// The seed of model i's process within a run seeded `seed` (each model its own stream,
/// so adding a model never changes the others' arrivals).
uint64_t model_seed(uint64_t seed, size_t model_index);

struct gamma_workload {
  std::vector<std::string> models;
  /// One rate per model, requests per second.
  std::vector<double> rates;
  double cv = 1;
  double duration_s = 30;
  uint64_t seed = 1;
};

/// Every model's Gamma process merged in time order. Errors name the bad field:
/// models and rates of different lengths, no models, duplicate names, negative or
/// non-finite rates, cv or duration.
caf::expected<schedule> generate(const gamma_workload& w);

/// Reads a trace: CSV lines `time_s,model[,prompt_len[,max_tokens]]`, an optional header
/// line starting with "time", blank lines and `#` comments ignored; times need not be
/// sorted (they are sorted, stably). Errors name the source and the line: a malformed
/// or negative number, a missing model, extra columns.
caf::expected<schedule> parse_trace(std::istream& in, const std::string& source);
caf::expected<schedule> read_trace(const std::string& path);

/// Writes a schedule in the trace format parse_trace reads.
void write_trace(std::ostream& out, const schedule& s);

/// Checks that every model a schedule names is in `known`; the error lists the
/// unknown ones and the known ones.
caf::error check_models(const schedule& s, const std::vector<std::string>& known);

/// Splits "a,b,c" (empty parts are errors) and parses "10,1,1" as numbers.
caf::expected<std::vector<std::string>> split_list(const std::string& text,
                                                   const std::string& what);
caf::expected<std::vector<double>> parse_numbers(const std::string& text, const std::string& what);

}  // namespace computron::workload
