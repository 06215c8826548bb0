// loadgen's LLM mode as plain functions: length distributions, the lengths CSV, the
// metrics (TTFT, TPOT, ITL, goodput) and their report, the stream's events, and the
// open-loop client reading an event stream that arrives in pieces over a real socket.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <numeric>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.hpp"
#include "net/client/llm_lengths.hpp"
#include "net/client/llm_loadgen.hpp"
#include "net/client/llm_metrics.hpp"
#include "net/client/llm_report.hpp"
#include "net/client/open_loop.hpp"

using namespace computron;
using namespace computron::net;
using json = nlohmann::json;

namespace {

std::string error_of(const caf::error& e) {
  return render(e);
}

/// A success streamed from `sent` with text chunks at `chunks`, ending at `done`.
stream_record streamed(double sent, std::vector<double> chunks, double done, int64_t out,
                       std::string model = "m") {
  stream_record r;
  r.model = std::move(model);
  r.arrival_s = sent;
  r.sent_s = sent;
  r.chunk_s = std::move(chunks);
  r.done_s = done;
  r.prompt_tokens = 10;
  r.output_tokens = out;
  r.status = 200;
  return r;
}

stream_record failed(const std::string& kind, const std::string& message, double at = 0) {
  stream_record r;
  r.model = "m";
  r.sent_s = at;
  r.done_s = at + 0.01;
  r.status = 400;
  r.error_kind = kind;
  r.error = message;
  return r;
}

}  // namespace

TEST_CASE("length distributions parse from their flags and refuse bad specs",
          "[loadgen][llm][lengths]") {
  auto fixed = parse_length_dist("fixed", 64, "--prompt-dist");
  REQUIRE(fixed);
  CHECK(fixed->kind == length_kind::fixed);
  CHECK(fixed->mean == 64);
  auto uniform = parse_length_dist("uniform:0.25", 64, "--prompt-dist");
  REQUIRE(uniform);
  CHECK(uniform->kind == length_kind::uniform);
  CHECK(uniform->spread == 0.25);
  auto lognormal = parse_length_dist("lognormal:1.5", 8, "--output-dist");
  REQUIRE(lognormal);
  CHECK(lognormal->kind == length_kind::lognormal);
  CHECK(lognormal->spread == 1.5);

  auto why = [](const std::string& spec, int64_t mean = 64) {
    auto d = parse_length_dist(spec, mean, "--prompt-dist");
    REQUIRE_FALSE(d);
    CHECK(is(d.error(), ec::invalid_request));
    return error_of(d.error());
  };
  CHECK_THAT(why("normal:1"), Catch::Contains("--prompt-dist: unknown distribution 'normal'"));
  CHECK_THAT(why("uniform"), Catch::Contains("uniform needs a spread"));
  CHECK_THAT(why("uniform:x"), Catch::Contains("spread 'x' of uniform must be a number in 0..1"));
  CHECK_THAT(why("uniform:1.5"), Catch::Contains("in 0..1"));
  CHECK_THAT(why("lognormal:-0.5"), Catch::Contains("in 0..10"));
  CHECK_THAT(why("lognormal:0.5x"), Catch::Contains("spread '0.5x'"));
  CHECK_THAT(why("fixed:3"), Catch::Contains("fixed takes no spread"));
  CHECK_THAT(why("fixed", 0), Catch::Contains("the mean length 0 is under 1"));
  CHECK_THAT(why("fixed", -5), Catch::Contains("the mean length -5 is under 1"));
}

TEST_CASE("length draws have the distribution's range, mean and spread",
          "[loadgen][llm][lengths]") {
  std::mt19937_64 rng{7};
  length_dist fixed{length_kind::fixed, 64, 0};
  for (int i = 0; i < 100; ++i) CHECK(draw_length(fixed, rng) == 64);

  length_dist uniform{length_kind::uniform, 100, 0.2};
  std::set<int64_t> seen;
  for (int i = 0; i < 5000; ++i) {
    auto x = draw_length(uniform, rng);
    REQUIRE(x >= 80);
    REQUIRE(x <= 120);
    seen.insert(x);
  }
  CHECK(seen.size() == 41);  // every length of the range, its ends included

  // A lognormal of mean 64 and CV 0.5: the sample's mean and CV within a few percent.
  length_dist lognormal{length_kind::lognormal, 64, 0.5};
  std::vector<double> xs;
  for (int i = 0; i < 40000; ++i) {
    auto x = draw_length(lognormal, rng);
    REQUIRE(x >= 1);
    xs.push_back(static_cast<double>(x));
  }
  double mean = std::accumulate(xs.begin(), xs.end(), 0.0) / static_cast<double>(xs.size());
  double sq = 0;
  for (auto x : xs) sq += (x - mean) * (x - mean);
  double cv = std::sqrt(sq / static_cast<double>(xs.size())) / mean;
  CHECK(mean == Approx(64).epsilon(0.02));
  CHECK(cv == Approx(0.5).epsilon(0.05));
  // Skewed as a lognormal is: the median under the mean.
  std::sort(xs.begin(), xs.end());
  CHECK(xs[xs.size() / 2] < mean * 0.97);

  // Short means never give a zero length, and the same seed gives the same draws.
  length_dist tiny{length_kind::lognormal, 1, 3};
  std::mt19937_64 a{3}, b{3};
  for (int i = 0; i < 1000; ++i) {
    auto x = draw_length(tiny, a);
    CHECK(x >= 1);
    CHECK(x == draw_length(tiny, b));
  }
}

TEST_CASE("the lengths CSV reads pairs and names the line of a bad one",
          "[loadgen][llm][lengths]") {
  std::istringstream good{"prompt_len,output_len\n# measured\n\n12, 30\n7,1\r\n"};
  auto rows = parse_length_pairs(good, "pairs.csv");
  REQUIRE(rows);
  REQUIRE(rows->size() == 2);
  CHECK((*rows)[0].prompt_len == 12);
  CHECK((*rows)[0].output_len == 30);
  CHECK((*rows)[1].prompt_len == 7);
  CHECK((*rows)[1].output_len == 1);

  auto why = [](const std::string& text) {
    std::istringstream in{text};
    auto r = parse_length_pairs(in, "pairs.csv");
    REQUIRE_FALSE(r);
    return error_of(r.error());
  };
  CHECK_THAT(why("4,5\n-3,2\n"),
             Catch::Contains("pairs.csv line 2: prompt_len '-3' is not a whole number"));
  CHECK_THAT(why("4,5\n3,0\n"), Catch::Contains("line 2: output_len '0'"));
  CHECK_THAT(why("4,5\n3,x\n"), Catch::Contains("line 2: output_len 'x'"));
  CHECK_THAT(why("4,5.5\n"), Catch::Contains("line 1: output_len '5.5'"));
  CHECK_THAT(why("1,2,3\n"), Catch::Contains("line 1: 3 columns; expected prompt_len,output_len"));
  CHECK_THAT(why("4\n"), Catch::Contains("line 1: 1 columns"));
  CHECK_THAT(why("4,\n"), Catch::Contains("line 1: output_len ''"));
  CHECK_THAT(why("prompt_len,output_len\n"), Catch::Contains("pairs.csv has no rows"));
  auto missing = read_length_pairs("/nonexistent/pairs.csv");
  REQUIRE_FALSE(missing);
  CHECK_THAT(error_of(missing.error()), Catch::Contains("cannot open lengths file"));
}

TEST_CASE("lengths go to the arrivals that have none, and fit the context",
          "[loadgen][llm][lengths]") {
  workload::schedule s;
  s.models = {"a"};
  for (int i = 0; i < 200; ++i) s.arrivals.push_back({0.01 * i, 0, 0, 0});
  s.arrivals[5].prompt_len = 999;  // a trace's own lengths stay
  s.arrivals[5].max_tokens = 3;
  length_source rows_src;
  rows_src.rows = {{4, 3}, {6, 5}, {100, 1}};
  auto copy = s;
  assign_lengths(s, rows_src, 11);
  assign_lengths(copy, rows_src, 11);
  std::set<std::pair<int64_t, int64_t>> drawn;
  for (size_t i = 0; i < s.arrivals.size(); ++i) {
    auto& a = s.arrivals[i];
    CHECK(a.prompt_len == copy.arrivals[i].prompt_len);  // deterministic for a seed
    CHECK(a.max_tokens == copy.arrivals[i].max_tokens);
    if (i == 5) continue;
    drawn.insert({a.prompt_len, a.max_tokens});
  }
  CHECK(drawn == std::set<std::pair<int64_t, int64_t>>{{4, 3}, {6, 5}, {100, 1}});
  CHECK(s.arrivals[5].prompt_len == 999);
  CHECK(s.arrivals[5].max_tokens == 3);

  int64_t p = 100, o = 50;
  CHECK_FALSE(fit_lengths(p, o, 150));
  CHECK_FALSE(fit_lengths(p, o, 0));  // no limit known
  CHECK(fit_lengths(p, o, 120));
  CHECK(p == 70);
  CHECK(o == 50);
  p = 10, o = 500;
  CHECK(fit_lengths(p, o, 64));
  CHECK(p == 1);
  CHECK(o == 63);
}

TEST_CASE("per-request metrics: TTFT, TPOT and ITL as vLLM defines them", "[loadgen][llm]") {
  // Sent at 1.0; chunks at 1.2, 1.3, 1.5; done at 1.5; four tokens (one chunk held two).
  auto r = streamed(1.0, {1.2, 1.3, 1.5}, 1.5, 4);
  CHECK(r.ttft_s() == Approx(0.2));
  CHECK(r.e2e_s() == Approx(0.5));
  REQUIRE(r.tpot_s());
  CHECK(*r.tpot_s() == Approx(0.3 / 3));
  auto itl = r.itl_s();
  REQUIRE(itl.size() == 2);
  CHECK(itl[0] == Approx(0.1));
  CHECK(itl[1] == Approx(0.2));
  // One token: no TPOT; no chunk with text: the first token came with the end.
  CHECK_FALSE(streamed(0, {0.1}, 0.1, 1).tpot_s());
  CHECK(streamed(0, {}, 0.4, 1).ttft_s() == Approx(0.4));
}

TEST_CASE("metric summaries: mean, median, std and percentiles as numpy gives them",
          "[loadgen][llm]") {
  std::vector<double> xs(100);
  std::iota(xs.begin(), xs.end(), 1.0);
  std::reverse(xs.begin(), xs.end());
  auto m = summarize_metric(xs, {90, 99, 99.9});
  CHECK(m.count == 100);
  CHECK(m.mean == Approx(50.5));
  CHECK(m.median == Approx(50.5));
  CHECK(m.stdev == Approx(std::sqrt((100.0 * 100 - 1) / 12)));
  CHECK(m.max == 100);
  REQUIRE(m.percentiles.size() == 3);
  CHECK(m.percentiles[0].second == Approx(90.1));  // rank 0.9 * 99 = 89.1
  CHECK(m.percentiles[1].second == Approx(99.01));
  CHECK(m.percentiles[2].second == Approx(99.901));
  auto empty = summarize_metric({}, {99});
  CHECK(empty.count == 0);
  CHECK(empty.percentiles.at(0).second == 0);

  auto p = parse_percentiles("99,50,90,99", "--metric-percentiles");
  REQUIRE(p);
  CHECK(*p == std::vector<double>{50, 90, 99});
  for (auto bad : {"0", "101", "x", "50,,90", "-1"}) {
    INFO(bad);
    auto q = parse_percentiles(bad, "--metric-percentiles");
    REQUIRE_FALSE(q);
    CHECK_THAT(error_of(q.error()), Catch::Contains("--metric-percentiles"));
  }
  CHECK(percentile_name(99) == "p99");
  CHECK(percentile_name(99.9) == "p99.9");
}

TEST_CASE("goodput counts the successes within every SLO, and failures miss it",
          "[loadgen][llm][goodput]") {
  std::vector<stream_record> rs;
  rs.push_back(streamed(0, {0.1, 0.2, 0.3}, 0.3, 3, "a"));   // TTFT 0.1, TPOT 0.1
  rs.push_back(streamed(1, {1.5, 1.55, 1.6}, 1.6, 3, "a"));  // TTFT 0.5: misses TTFT
  rs.push_back(streamed(2, {2.1, 2.5, 2.9}, 2.9, 3, "b"));   // TPOT 0.4: misses TPOT
  rs.push_back(streamed(3, {3.05}, 3.05, 1, "b"));           // one token: no TPOT to miss
  rs.push_back(failed("http_400", "'max_tokens' must be at most 512", 3.5));
  rs.back().model = "b";
  rs.push_back(failed("http_400", "a second message, not shown", 3.6));
  rs.back().model = "b";
  stream_record never;
  never.model = "a";
  rs.push_back(never);  // cancelled before it was sent
  llm_slo slo{0.2, 0.2, 0};
  CHECK(meets_slo(rs[0], slo));
  CHECK_FALSE(meets_slo(rs[1], slo));
  CHECK_FALSE(meets_slo(rs[2], slo));
  CHECK(meets_slo(rs[3], slo));
  CHECK_FALSE(meets_slo(rs[4], slo));
  CHECK(meets_slo(rs[1], llm_slo{}));  // no SLO: every success is good

  auto s = summarize_llm({"a", "b"}, rs, slo, {50, 99});
  CHECK(s.duration_s == Approx(3.61));
  CHECK(s.unsent == 1);
  auto& g = s.overall;
  CHECK(g.sent == 6);
  CHECK(g.ok == 4);
  CHECK(g.failed == 2);
  CHECK(g.good == 2);
  CHECK(g.goodput == Approx(2 / 3.61));
  CHECK(g.request_throughput == Approx(4 / 3.61));
  CHECK(g.slo_attainment == Approx(2.0 / 6));
  CHECK(g.input_tokens == 40);
  CHECK(g.output_tokens == 10);
  CHECK(g.output_throughput == Approx(10 / 3.61));
  CHECK(g.total_token_throughput == Approx(50 / 3.61));
  CHECK(g.errors.at("http_400") == 2);
  CHECK(g.first_error.at("http_400") == "'max_tokens' must be at most 512");
  CHECK(g.ttft.count == 4);
  CHECK(g.tpot.count == 3);  // the single-token answer has none
  CHECK(g.itl.count == 6);
  CHECK(s.per_model[0].ok == 2);
  CHECK(s.per_model[0].good == 1);
  CHECK(s.per_model[1].failed == 2);
  CHECK(s.per_model[1].slo_attainment == Approx(1.0 / 4));
}

TEST_CASE("the report prints vLLM's block and JSON keys, with the first error's message",
          "[loadgen][llm][report]") {
  std::vector<stream_record> rs{streamed(0, {0.1, 0.2}, 0.2, 2, "a"),
                                streamed(0, {0.3, 0.5}, 0.5, 2, "b"),
                                failed("http_400", "'max_tokens' must be at most 512")};
  auto s = summarize_llm({"a", "b"}, rs, llm_slo{0.2, 0, 0}, {50, 99});
  s.max_concurrency = 4;
  workload::device_traffic d;
  d.device = "0";
  d.shard_loads = 2;
  auto text = llm_table(s, {d});
  CHECK_THAT(text, Catch::Contains("============ Serving Benchmark Result ============"));
  CHECK_THAT(text, Catch::Contains("Successful requests:                     2"));
  CHECK_THAT(text, Catch::Contains("Maximum request concurrency:             4"));
  CHECK_THAT(text, Catch::Contains("Request goodput (req/s):                 2.00"));  // 1 / 0.5 s
  CHECK_THAT(text, Catch::Contains("-- Time to First Token --"));
  CHECK_THAT(text, Catch::Contains("Mean TTFT (ms):                          200.00"));
  CHECK_THAT(text, Catch::Contains("P99 TTFT (ms):                           298.00"));
  CHECK_THAT(text, Catch::Contains("Median TPOT (ms):                        150.00"));
  CHECK_THAT(text, Catch::Contains("P99 E2EL (ms):"));
  CHECK_THAT(text, !Catch::Contains("P50 E2EL"));  // the median says it
  CHECK_THAT(text,
             Catch::Contains("failed: 1 x http_400: first: 'max_tokens' must be at most 512"));
  CHECK_THAT(text, Catch::Contains("device 0: 2 shard loads"));
  CHECK_THAT(text, Catch::Contains("p99 TTFT"));  // the per-model table

  auto j = json::parse(llm_json(s, {d}, R"({"url": "http://x"})"));
  CHECK(j.at("completed") == 2);
  CHECK(j.at("failed") == 1);
  CHECK(j.at("max_concurrency") == 4);
  CHECK(j.at("mean_ttft_ms").get<double>() == Approx(200));
  CHECK(j.at("p99_ttft_ms").get<double>() == Approx(298));
  CHECK(j.at("median_tpot_ms").get<double>() == Approx(150));
  CHECK(j.at("request_goodput").get<double>() == Approx(2));
  CHECK(j.at("first_errors").at("http_400") == "'max_tokens' must be at most 512");
  CHECK(j.at("models").at("b").at("completed") == 1);
  CHECK(j.at("devices").at("0").at("shard_loads") == 2);
  CHECK(j.at("url") == "http://x");
}

TEST_CASE("the CDF picture keeps each legend inside its plot area", "[loadgen][llm][report]") {
  for (size_t entries : {1u, 3u, 12u})
    for (size_t chars : {3u, 30u, 400u}) {
      auto b = place_legend(60, 70, 460, 300, entries, chars);
      CHECK(b.x >= 60);
      CHECK(b.y >= 70);
      CHECK(b.x + b.w <= 60 + 460);
      CHECK(b.y + b.h <= 70 + 300);
      CHECK(b.max_chars * 6.6 + 26 <= 460);
    }
  const std::string long_name(120, 'x');
  std::vector<stream_record> rs{streamed(0, {0.1, 0.2}, 0.2, 2, long_name),
                                streamed(0, {0.3, 0.5}, 0.5, 2, "short")};
  auto s = summarize_llm({long_name, "short"}, rs, {}, {50, 90, 99});
  auto svg = llm_cdf_svg(s, rs);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  for (auto title : {"TTFT", "TPOT", "ITL", "E2EL"}) CHECK(svg.find(title) != std::string::npos);
  CHECK(svg.find("short (n=1)") != std::string::npos);
  CHECK(svg.find(long_name) == std::string::npos);  // cut to fit the box, not past the edge
  CHECK(svg.find("p99 ") != std::string::npos);
  // No text starts beyond the picture's width.
  std::regex x_attr{R"re(<text x="([0-9.]+)")re"};
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), x_attr); it != std::sregex_iterator();
       ++it)
    CHECK(std::stod((*it)[1]) < 1100);
}

TEST_CASE("stream events: text chunks, finishes, usage, errors and garbage",
          "[loadgen][llm][sse]") {
  auto text = parse_stream_event(
      R"({"id":"c","object":"text_completion","choices":[{"index":0,"text":" hi","finish_reason":null}]})");
  CHECK(text.text);
  CHECK(text.error.empty());
  auto finish =
      parse_stream_event(R"({"choices":[{"index":0,"text":"","finish_reason":"length"}]})");
  CHECK_FALSE(finish.text);
  CHECK(finish.error.empty());
  auto usage = parse_stream_event(
      R"({"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":12}})");
  CHECK_FALSE(usage.text);
  CHECK(usage.prompt_tokens == 7);
  CHECK(usage.completion_tokens == 5);
  auto error = parse_stream_event(
      R"({"error":{"message":"model m is registering","type":"service_unavailable","code":"unavailable"}})");
  CHECK(error.error == "model m is registering");
  CHECK(error.error_code == "unavailable");
  CHECK(parse_stream_event("[DONE]").done);
  auto garbage = parse_stream_event("not json");
  CHECK(garbage.error_code == "bad_event");
  CHECK_THAT(garbage.error, Catch::Contains("not json"));
  CHECK(parse_stream_event(R"({"choices": 3})").error_code == "bad_event");

  auto body = json::parse(completion_body("m", {5, 6, 7}, 9, 0));
  CHECK(body.at("prompt") == json({5, 6, 7}));
  CHECK(body.at("max_tokens") == 9);
  CHECK(body.at("ignore_eos") == true);
  CHECK(body.at("stream") == true);
  CHECK(body.at("stream_options").at("include_usage") == true);
  CHECK_FALSE(body.contains("deadline_ms"));
  auto late = json::parse(completion_body("m", {1}, 1, 250));
  CHECK(late.at("deadline_ms") == 250);
  CHECK(late.at("drop_late") == true);
}

TEST_CASE("a request's outcome: usage counts, errors in and before the stream, cut streams",
          "[loadgen][llm][sse]") {
  auto record = [] {
    stream_record r;
    r.prompt_tokens = 9;  // asked
    r.chunk_s = {0.2, 0.3};
    return r;
  };
  timed_result ok;
  ok.sent_s = 0.1;
  ok.done_s = 0.4;
  ok.status = 200;

  // A whole stream: usage gives the tokens (a chunk may hold several).
  stream_outcome whole;
  for (auto data :
       {R"js({"choices":[{"text":"a"}]})js",
        R"js({"choices":[],"usage":{"prompt_tokens":8,"completion_tokens":5}})js", "[DONE]"})
    whole.add(parse_stream_event(data));
  auto r = record();
  settle(r, whole, ok);
  CHECK(r.ok());
  CHECK(r.prompt_tokens == 8);
  CHECK(r.output_tokens == 5);
  CHECK(r.sent_s == 0.1);
  CHECK(r.done_s == 0.4);
  // Without usage: the chunks that carried text.
  stream_outcome bare;
  bare.add(parse_stream_event("[DONE]"));
  r = record();
  settle(r, bare, ok);
  CHECK(r.ok());
  CHECK(r.prompt_tokens == 9);
  CHECK(r.output_tokens == 2);

  // An error after the stream began: the first error event, by its code.
  stream_outcome failing;
  failing.add(parse_stream_event(
      R"js({"error":{"message":"would miss its deadline (drop_late)","code":"deadline_exceeded"}})js"));
  failing.add(parse_stream_event(R"js({"error":{"message":"second","code":"other"}})js"));
  failing.add(parse_stream_event("[DONE]"));
  r = record();
  settle(r, failing, ok);
  CHECK_FALSE(r.ok());
  CHECK(r.error_kind == "stream_deadline_exceeded");
  CHECK(r.error == "would miss its deadline (drop_late)");

  // A stream cut before [DONE] is not a success, however many chunks came.
  r = record();
  settle(r, stream_outcome{}, ok);
  CHECK_FALSE(r.ok());
  CHECK(r.error_kind == "bad_response");
  CHECK_THAT(r.error, Catch::Contains("without [DONE]"));

  // Refused before any stream: the status, and OpenAI's message rather than the JSON.
  timed_result refused = ok;
  refused.status = 400;
  refused.body =
      R"js({"error":{"message":"'max_tokens' must be an integer in 1..512","type":"invalid_request_error","param":"max_tokens","code":"invalid_request"}})js";
  r = record();
  settle(r, stream_outcome{}, refused);
  CHECK(r.error_kind == "http_400");
  CHECK(r.error == "'max_tokens' must be an integer in 1..512");
  // No answer at all: the client's reason.
  timed_result gone = ok;
  gone.status = 0;
  gone.error = "connect: Connection refused";
  r = record();
  settle(r, stream_outcome{}, gone);
  CHECK(r.error_kind == "connect");
  CHECK(r.error == "connect: Connection refused");
}

namespace {

/// A one-shot HTTP server on 127.0.0.1 that answers one request with a chunked event
/// stream written in pieces, one event split across two of them.
struct piecewise_server {
  int listener = -1;
  uint16_t port = 0;
  std::thread thread;

  explicit piecewise_server(std::vector<std::string> pieces) {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(listener >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener, 1) == 0);
    socklen_t len = sizeof a;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
    thread = std::thread{[this, pieces = std::move(pieces)] { serve(pieces); }};
  }

  void serve(const std::vector<std::string>& pieces) {
    pollfd p{listener, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return;  // bounded: the client never came
    int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    std::string req;
    char buf[4096];
    while (req.find("\r\n\r\n") == std::string::npos) {
      pollfd q{fd, POLLIN, 0};
      if (::poll(&q, 1, 10000) != 1) break;
      auto n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
    auto send = [fd](const std::string& s) { (void)!::write(fd, s.data(), s.size()); };
    send(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
        "chunked\r\n\r\n");
    for (auto& piece : pieces) {
      send(fmt::format("{:x}\r\n{}\r\n", piece.size(), piece));
      // Apart in time, so the client reads them apart (the events' times must differ).
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    send("0\r\n\r\n");
    ::close(fd);
  }

  ~piecewise_server() {
    if (thread.joinable()) thread.join();
    ::close(listener);
  }
};

}  // namespace

TEST_CASE("the open-loop client hands over each event of a stream as it arrives",
          "[loadgen][llm][sse][socket]") {
  piecewise_server srv{{"data: {\"a\":1}\n\n", "data: {\"b\"", ":2}\n\ndata: [DONE]\n\n"}};
  std::vector<std::pair<double, std::string>> events;
  open_loop_options o;
  o.port = srv.port;
  o.request_timeout = std::chrono::milliseconds(10000);
  o.on_event = [&](size_t i, double at, std::string_view data) {
    CHECK(i == 0);
    events.emplace_back(at, std::string{data});
  };
  timed_request req{0, "POST", "/v1/completions", "{}"};
  req.stream = true;
  auto results = run_open_loop({req}, o);
  REQUIRE(results);
  REQUIRE(results->size() == 1);
  auto& r = results->front();
  CHECK(r.status == 200);
  CHECK(r.error.empty());
  CHECK(r.body.empty());  // events are handed over, not kept
  REQUIRE(events.size() == 3);
  CHECK(events[0].second == R"({"a":1})");
  CHECK(events[1].second == R"({"b":2})");  // joined across the two pieces
  CHECK(events[2].second == "[DONE]");
  // The split event is timed when its second piece came, after the first event.
  CHECK(events[1].first >= events[0].first + 0.02);
  CHECK(r.done_s >= events[2].first);
}
