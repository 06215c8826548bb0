#include "apps/computron/loadgen.hpp"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
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
    auto line = fmt::format("[{}{}] sent {}/{}  done {}  failed {}  {:.1f}/{:.1f} s",
                            std::string(static_cast<size_t>(filled), '#'),
                            std::string(static_cast<size_t>(width - filled), '.'), p.sent, p.total,
                            p.done, p.failed, p.elapsed_s, duration_s_);
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

}  // namespace

std::string check_workload_flags(const loadgen_cli& cli) {
  if (cli.prompt_len < 1) return "--prompt-len must be at least 1";
  if (cli.max_tokens < 1) return "--max-tokens must be at least 1";
  if (!(cli.slo_s >= 0) || !std::isfinite(cli.slo_s)) return "--slo must be 0 or more seconds";
  if (cli.drop_late && !(cli.slo_s >= 0.001))
    return "--drop-late needs --slo (of at least 0.001 s): it becomes each request's deadline";
  if (!cli.trace.empty() &&
      (!cli.models.empty() || !cli.rates.empty() || cli.power_law_alpha || cli.total_rate))
    return "--trace replays a file: it takes no --models, --rates, --power-law or --total-rate";
  if (!cli.rates.empty() && (cli.power_law_alpha || cli.total_rate))
    return "give either --rates or --power-law/--total-rate, not both";
  if (cli.power_law_alpha && !cli.total_rate) return "--power-law needs --total-rate";
  if (!(cli.cv >= 0) || !std::isfinite(cli.cv)) return "--cv must be 0 or more";
  if (!(cli.duration_s > 0) || !std::isfinite(cli.duration_s))
    return "--duration must be a positive number of seconds";
  return {};
}

caf::expected<workload::schedule> make_schedule(const loadgen_cli& cli,
                                                const std::vector<std::string>& known,
                                                std::string* described_json) {
  auto bad = [](std::string why) { return make_error(ec::invalid_request, std::move(why)); };
  if (auto why = check_workload_flags(cli); !why.empty()) return bad(why);
  workload::schedule sched;
  json described;
  if (!cli.trace.empty()) {
    auto s = workload::read_trace(cli.trace);
    if (!s) return s.error();
    sched = std::move(*s);
    described = {{"kind", "trace"}, {"file", cli.trace}, {"arrivals", sched.arrivals.size()}};
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
  if (auto why = check_workload_flags(cli); !why.empty()) return usage(why);
  if (cli.max_connections < 1) return usage("--max-connections must be at least 1");
  if (!(cli.timeout_s > 0)) return usage("--timeout must be positive");
  // Everything that can be checked without the server is checked first.
  if (!cli.trace.empty()) {
    if (auto s = workload::read_trace(cli.trace); !s) return usage(render(s.error()));
  } else if (!cli.rates.empty()) {
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

  auto served =
      net::discover(*at, std::chrono::milliseconds(static_cast<int64_t>(cli.wait_ready_s * 1000)));
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
  auto described = json::parse(described_text);

  net::loadgen_options o;
  o.server = *at;
  o.prompt_len = cli.prompt_len;
  o.max_tokens = cli.max_tokens;
  if (cli.drop_late) o.deadline_ms = static_cast<uint32_t>(std::lround(cli.slo_s * 1000));
  o.seed = cli.seed;
  o.max_connections = cli.max_connections;
  o.request_timeout = std::chrono::milliseconds(static_cast<int64_t>(cli.timeout_s * 1000));
  progress_bar bar{sched.duration_s};
  if (cli.progress) o.on_progress = [&bar](const net::open_loop_progress& p) { bar(p); };
  interrupted.store(false);
  o.cancel = &interrupted;
  auto previous_int = std::signal(SIGINT, on_interrupt);
  auto previous_term = std::signal(SIGTERM, on_interrupt);
  if (!cli.json)
    std::cout << fmt::format("computron loadgen: {} requests to {} models at {} over {:.1f} s\n",
                             sched.arrivals.size(), sched.models.size(), cli.url, sched.duration_s)
              << std::flush;
  auto run = net::run_loadgen(sched, *served, o);
  std::signal(SIGINT, previous_int);
  std::signal(SIGTERM, previous_term);
  if (!run) {
    std::cerr << "computron loadgen: " << render(run.error()) << '\n';
    return exit_unreachable;
  }
  auto summary = workload::summarize_run(sched.models, run->records, cli.slo_s, run->devices);
  json extra{{"url", cli.url}, {"workload", described}};
  if (interrupted.load()) extra["interrupted"] = true;
  if (cli.json)
    std::cout << workload::to_json(summary, extra.dump()) << '\n';
  else
    std::cout << workload::to_table(summary);
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

}  // namespace computron::app
