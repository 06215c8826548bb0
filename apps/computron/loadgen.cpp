#include "apps/computron/loadgen.hpp"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <functional>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/computron/loadgen_llm.hpp"
#include "common/error.hpp"
#include "net/client/llm_lengths.hpp"
#include "net/client/loadgen.hpp"
#include "workload/arrivals.hpp"
#include "workload/report.hpp"

namespace computron::app {

namespace {

using json = nlohmann::json;

constexpr int exit_unreachable = 1;
constexpr int exit_usage = 2;
constexpr int exit_some_failed = 3;

std::atomic<bool> interrupted{false};

extern "C" void on_interrupt(int) {
  interrupted.store(true);
}

int usage(const std::string& why) {
  std::cerr << "computron loadgen: " << why << '\n';
  return exit_usage;
}

/// The progress bar: redrawn in place on a terminal, a line every few seconds otherwise
/// (logs, CI).
class progress_bar {
 public:
  explicit progress_bar(double duration_s) : duration_s_(duration_s), tty_(isatty(2) != 0) {}

  void operator()(const net::open_loop_progress& p) {
    const bool last = p.final;
    if (!tty_ && !last && p.elapsed_s - last_line_s_ < 5.0) return;
    last_line_s_ = p.elapsed_s;
    const int width = 30;
    auto filled =
        p.total == 0
            ? width
            : static_cast<int>(width * static_cast<double>(p.done) / static_cast<double>(p.total));
    auto line = fmt::format("[{}{}] sent {}/{}  done {}  failed {}  {:.1f}",
                            std::string(static_cast<size_t>(filled), '#'),
                            std::string(static_cast<size_t>(width - filled), '.'), p.sent, p.total,
                            p.done, p.failed, p.elapsed_s);
    // A closed loop's requests are all due at the start: no planned duration to show.
    line += duration_s_ > 0 ? fmt::format("/{:.1f} s", duration_s_) : std::string{" s"};
    if (tty_)
      std::cerr << '\r' << line << "\x1b[K" << (last ? "\n" : "") << std::flush;
    else
      std::cerr << line << '\n';
  }

 private:
  double duration_s_;
  bool tty_;
  double last_line_s_ = -1e9;
};

/// The infer mode: KServe requests of token ids, loadgen's original table and report.
int run_infer(const loadgen_cli& cli, const net::server_address& at,
              const std::vector<net::served_model>& served, const workload::schedule& sched,
              const std::string& described_text,
              std::function<void(const net::open_loop_progress&)> on_progress) {
  net::loadgen_options o;
  o.server = at;
  o.prompt_len = cli.prompt_len;
  o.max_tokens = cli.max_tokens;
  if (cli.drop_late) o.deadline_ms = static_cast<uint32_t>(std::lround(cli.slo_s * 1000));
  o.seed = cli.seed;
  o.max_connections = in_flight_bound(cli);
  o.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(cli.timeout_s * 1000));
  o.on_progress = std::move(on_progress);
  o.cancel = &interrupted;
  auto run = net::run_loadgen(sched, served, o);
  if (!run) {
    std::cerr << "computron loadgen: " << render(run.error()) << '\n';
    return exit_unreachable;
  }
  auto summary = workload::summarize_run(sched.models, run->records, cli.slo_s, run->devices);
  json extra{{"url", cli.url}, {"api", "infer"}, {"workload", json::parse(described_text)}};
  if (interrupted.load()) extra["interrupted"] = true;
  if (cli.json)
    std::cout << workload::to_json(summary, extra.dump()) << '\n';
  else
    std::cout << workload::to_table(summary) << first_errors(run->records);
  if (!cli.report_dir.empty()) {
    if (auto err = workload::write_report(cli.report_dir, summary, run->records, run->swaps,
                                          extra.dump())) {
      std::cerr << "computron loadgen: " << render(err) << '\n';
      return exit_unreachable;
    }
    if (!cli.json) std::cout << "report written to " << cli.report_dir << '\n';
  }
  return summary.overall.failed > 0 || summary.unsent > 0 ? exit_some_failed : 0;
}

}  // namespace

caf::error check_workload_flags(const loadgen_cli& cli) {
  auto bad = [](std::string why) { return make_error(ec::invalid_request, std::move(why)); };
  if (cli.prompt_len < 1) return bad("--prompt-len must be at least 1");
  if (cli.max_tokens < 1) return bad("--max-tokens must be at least 1");
  if (!(cli.slo_s >= 0) || !std::isfinite(cli.slo_s)) return bad("--slo must be 0 or more seconds");
  if (cli.drop_late && !(cli.slo_s >= 0.001))
    return bad("--drop-late needs --slo (of at least 0.001 s): it becomes each request's deadline");
  if (!cli.trace.empty() &&
      (!cli.models.empty() || !cli.rates.empty() || cli.power_law_alpha || cli.total_rate))
    return bad(
        "--trace replays a file: it takes no --models, --rates, --power-law or --total-rate");
  if (!cli.rates.empty() && (cli.power_law_alpha || cli.total_rate))
    return bad("give either --rates or --power-law/--total-rate, not both");
  if (cli.power_law_alpha && !cli.total_rate) return bad("--power-law needs --total-rate");
  if (!(cli.cv >= 0) || !std::isfinite(cli.cv)) return bad("--cv must be 0 or more");
  if (!(cli.duration_s > 0) || !std::isfinite(cli.duration_s))
    return bad("--duration must be a positive number of seconds");
  return check_llm_flags(cli);
}

caf::expected<workload::schedule> make_schedule(const loadgen_cli& cli,
                                                const std::vector<std::string>& known,
                                                std::string* described_json) {
  auto bad = [](std::string why) { return make_error(ec::invalid_request, std::move(why)); };
  if (auto err = check_workload_flags(cli)) return err;
  workload::schedule sched;
  json described;
  if (!cli.trace.empty()) {
    auto s = workload::read_trace(cli.trace);
    if (!s) return s.error();
    sched = std::move(*s);
    described = {{"kind", "trace"}, {"file", cli.trace}, {"arrivals", sched.arrivals.size()}};
  } else if (cli.num_prompts > 0) {
    // A closed loop (with --max-concurrency): every request due at once, the bound on
    // requests in flight paces them.
    std::vector<std::string> names = known;
    if (!cli.models.empty()) {
      auto m = workload::split_list(cli.models, "--models");
      if (!m) return m.error();
      names = *m;
    }
    if (names.empty()) return make_error(ec::unknown_model, "the server has no models");
    sched.models = names;
    for (int64_t i = 0; i < cli.num_prompts; ++i)
      sched.arrivals.push_back(
          {0.0, static_cast<uint32_t>(static_cast<size_t>(i) % names.size()), 0, 0});
    described = {{"kind", "closed"}, {"models", names}, {"num_prompts", cli.num_prompts}};
  } else {
    std::vector<double> rates;
    if (!cli.rates.empty()) {
      auto r = workload::parse_numbers(cli.rates, "--rates");
      if (!r) return r.error();
      rates = *r;
      for (auto x : rates)
        if (!(x >= 0)) return bad(fmt::format("--rates: {} is negative; rates are 0 or more", x));
    }
    std::vector<std::string> names;
    if (!cli.models.empty()) {
      auto m = workload::split_list(cli.models, "--models");
      if (!m) return m.error();
      names = *m;
    }
    if (!names.empty() && !rates.empty() && rates.size() != names.size())
      return bad(fmt::format("{} rates for {} models: give one rate per model", rates.size(),
                             names.size()));
    if (names.empty()) names = known;
    if (names.empty()) return make_error(ec::unknown_model, "the server has no models");
    if (cli.total_rate) {
      auto r =
          workload::power_law_rates(names.size(), *cli.total_rate, cli.power_law_alpha.value_or(0));
      if (!r) return r.error();
      rates = *r;
    } else if (rates.empty()) {
      rates.assign(names.size(), 1.0);  // one request per second per model
    }
    workload::gamma_workload w{names, rates, cli.cv, cli.duration_s, cli.seed};
    auto s = workload::generate(w);
    if (!s) return s.error();
    sched = std::move(*s);
    described = {{"kind", "gamma"},
                 {"models", names},
                 {"rates", rates},
                 {"cv", cli.cv},
                 {"duration_s", cli.duration_s},
                 {"seed", cli.seed}};
    if (cli.power_law_alpha) described["power_law_alpha"] = *cli.power_law_alpha;
  }
  if (auto err = workload::check_models(sched, known)) return err;
  if (described_json) *described_json = described.dump();
  return sched;
}

int run_loadgen_cli(const loadgen_cli& cli) {
  auto at = net::parse_url(cli.url);
  if (!at) return usage(render(at.error()));
  if (auto err = check_workload_flags(cli)) return usage(render(err));
  if (cli.max_connections < 1) return usage("--max-connections must be at least 1");
  if (!(cli.timeout_s > 0)) return usage("--timeout must be positive");
  // Everything that can be checked without the server is checked first.
  if (!cli.rates.empty()) {
    auto r = workload::parse_numbers(cli.rates, "--rates");
    if (!r) return usage(render(r.error()));
    for (auto x : *r)
      if (!(x >= 0)) return usage(fmt::format("--rates: {} is negative; rates are 0 or more", x));
  }
  if (!cli.models.empty() && !cli.rates.empty()) {
    auto m = workload::split_list(cli.models, "--models");
    auto r = workload::parse_numbers(cli.rates, "--rates");
    if (m && r && m->size() != r->size())
      return usage(
          fmt::format("{} rates for {} models: give one rate per model", r->size(), m->size()));
  }
  auto wanted = models_named(cli);
  if (!wanted) return usage(render(wanted.error()));
  std::vector<net::length_pair> rows;
  if (!cli.lengths_csv.empty()) {
    auto read = net::read_length_pairs(cli.lengths_csv);
    if (!read) return usage(render(read.error()));
    rows = std::move(*read);
  }
  auto dataset = dataset_of(cli);
  if (!dataset) return usage(render(dataset.error()));

  // Only the models this run drives must be ready: a folder that failed elsewhere in the
  // server's repository does not hold the run up.
  auto served = net::discover(
      *at, std::chrono::milliseconds(static_cast<int64_t>(cli.wait_ready_s * 1000)), *wanted);
  if (!served) {
    std::cerr << "computron loadgen: " << render(served.error()) << '\n';
    return exit_unreachable;
  }
  std::vector<std::string> known;
  for (auto& m : *served) known.push_back(m.name);
  std::string described_text;
  auto made = make_schedule(cli, known, &described_text);
  if (!made) {
    if (is(made.error(), ec::unknown_model) && cli.models.empty() && cli.trace.empty()) {
      std::cerr << "computron loadgen: the server has no models\n";
      return exit_unreachable;
    }
    return usage(render(made.error()));
  }
  auto sched = std::move(*made);
  auto api = api_of(cli, *served, sched);
  if (!api) return usage(render(api.error()));
  auto lengths = lengths_of(cli, api->has_value(), std::move(rows));
  if (!lengths) return usage(render(lengths.error()));
  net::assign_lengths(sched, *lengths, cli.seed);
  // Text prompts are counted by the server before the first request: a prompt it cannot
  // read (no chat template, too long for the context) stops the run here.
  net::text_prompts texts;
  if (*api) {
    auto t = text_prompts_of(cli, *at, *served, sched, **api, *dataset);
    if (!t) {
      std::cerr << "computron loadgen: " << render(t.error()) << '\n';
      return is(t.error(), ec::invalid_request) ? exit_usage : exit_unreachable;
    }
    texts = std::move(*t);
  }

  progress_bar bar{sched.duration_s};
  std::function<void(const net::open_loop_progress&)> on_progress;
  if (cli.progress) on_progress = [&bar](const net::open_loop_progress& p) { bar(p); };
  interrupted.store(false);
  auto previous_int = std::signal(SIGINT, on_interrupt);
  auto previous_term = std::signal(SIGTERM, on_interrupt);
  if (!cli.json)
    std::cout << fmt::format("computron loadgen: {} requests to {} models at {} {}{}{}\n",
                             sched.arrivals.size(), sched.models.size(), cli.url,
                             cli.num_prompts > 0 ? std::string{"all due at the start"}
                                                 : fmt::format("over {:.1f} s", sched.duration_s),
                             !*api                         ? " (infer)"
                             : **api == net::llm_api::chat ? " (streamed chat completions)"
                                                           : " (streamed completions)",
                             cli.max_concurrency > 0
                                 ? fmt::format(", at most {} in flight", cli.max_concurrency)
                                 : std::string{})
              << std::flush;
  auto code = *api ? run_llm_cli(cli, *at, *served, sched, **api, std::move(texts), described_text,
                                 std::move(on_progress), &interrupted)
                   : run_infer(cli, *at, *served, sched, described_text, std::move(on_progress));
  std::signal(SIGINT, previous_int);
  std::signal(SIGTERM, previous_term);
  return code;
}

}  // namespace computron::app
