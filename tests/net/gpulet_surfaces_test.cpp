// Gpu-lets as an operator sees them in the trace (one track per gpu-let) and in the
// metrics (each lane's share and busy seconds), fed straight through the observer calls.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "net/metrics.hpp"
#include "net/trace.hpp"

using namespace computron;
using json = nlohmann::json;

namespace {

/// The trace's track names by track id.
std::map<int64_t, std::string> track_names(const json& trace) {
  std::map<int64_t, std::string> out;
  for (auto& e : trace["traceEvents"])
    if (e["ph"] == "M" && e["name"] == "thread_name")
      out[e["tid"].get<int64_t>()] = e["args"]["name"].get<std::string>();
  return out;
}

/// The batch spans of `model`.
std::vector<json> spans_of(const json& trace, const std::string& model) {
  std::vector<json> out;
  for (auto& e : trace["traceEvents"])
    if (e["ph"] == "X" && e["name"] == "batch " + model) out.push_back(e);
  return out;
}

/// The exposition line of `series` (name and labels), without its value; empty if none.
std::string line_of(const std::string& text, const std::string& series) {
  auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return {};
  auto end = text.find('\n', at + 1);
  return text.substr(at + 1, end - at - 1);
}

}  // namespace

TEST_CASE("the trace draws two gpu-lets of one device on two tracks that overlap in time",
          "[net][trace][gpulets]") {
  net::trace_recorder t;
  t.gpulets({{50, 50}, {100}});
  // Two models on the two halves of device 0 at once; a third on device 1, not split.
  t.batch_done("a", {0}, {0}, 2, 1.0, 0.5);
  t.batch_done("b", {0}, {1}, 3, 1.2, 0.5);
  t.batch_done("c", {1}, {0}, 1, 1.0, 0.1);
  auto j = json::parse(t.to_json());
  auto a = spans_of(j, "a"), b = spans_of(j, "b"), c = spans_of(j, "c");
  REQUIRE(a.size() == 1);
  REQUIRE(b.size() == 1);
  REQUIRE(c.size() == 1);
  auto ta = a[0]["tid"].get<int64_t>(), tb = b[0]["tid"].get<int64_t>();
  CHECK(ta == 0);  // lane 0 keeps the device's own track
  CHECK(ta != tb);
  // Their spans overlap: each starts before the other ends.
  auto start = [](const json& e) { return e["ts"].get<double>(); };
  auto end = [](const json& e) { return e["ts"].get<double>() + e["dur"].get<double>(); };
  CHECK(start(a[0]) < end(b[0]));
  CHECK(start(b[0]) < end(a[0]));
  auto names = track_names(j);
  CHECK(names[ta] == "device 0 \u00b7 gpu-let 0");
  CHECK(names[tb] == "device 0 \u00b7 gpu-let 1");
  CHECK(b[0]["args"]["gpu-let"] == 1);
  CHECK(b[0]["args"]["share"] == 50);
  // Device 1 is whole: its track and span as before gpu-lets.
  CHECK(c[0]["tid"] == 1);
  CHECK(names[1] == "device 1");
  CHECK(c[0]["args"] == json{{"rows", 1}});
}

TEST_CASE("a trace without gpu-lets has one track per device, named as before",
          "[net][trace][gpulets]") {
  net::trace_recorder t;
  t.gpulets({{100}, {100}});
  t.batch_done("a", {0, 1}, {0, 0}, 2, 1.0, 0.5);
  t.batch_done("b", {1}, {}, 1, 2.0, 0.5);  // no lanes: lane 0
  auto j = json::parse(t.to_json());
  auto names = track_names(j);
  CHECK(names == std::map<int64_t, std::string>{{0, "device 0"}, {1, "device 1"}});
  for (auto& e : j["traceEvents"]) CHECK(e["name"] != "thread_sort_index");
  for (auto& s : spans_of(j, "a")) CHECK(s["args"] == json{{"rows", 2}});
}

TEST_CASE("metrics expose each gpu-let's share and the seconds batches kept it busy",
          "[net][metrics][gpulets]") {
  net::metrics m;
  m.gpulets({{50, 50}, {100}});
  // A model on lane 1 of device 0 and lane 0 of device 1, twice.
  m.batch_done("a", {0, 1}, {1, 0}, 1, 0, 0.25);
  m.batch_done("a", {0, 1}, {1, 0}, 1, 1, 0.5);
  auto text = "\n" + m.render();
  INFO(text);
  CHECK(text.find("# TYPE computron_gpulet_share gauge") != std::string::npos);
  CHECK(text.find("# TYPE computron_gpulet_busy_seconds_total counter") != std::string::npos);
  CHECK(line_of(text, R"(computron_gpulet_share{device="0",lane="0"})") ==
        R"(computron_gpulet_share{device="0",lane="0"} 50)");
  CHECK(line_of(text, R"(computron_gpulet_share{device="0",lane="1"})") ==
        R"(computron_gpulet_share{device="0",lane="1"} 50)");
  CHECK(line_of(text, R"(computron_gpulet_share{device="1",lane="0"})") ==
        R"(computron_gpulet_share{device="1",lane="0"} 100)");
  CHECK(line_of(text, R"(computron_gpulet_busy_seconds_total{device="0",lane="1"})") ==
        R"(computron_gpulet_busy_seconds_total{device="0",lane="1"} 0.75)");
  CHECK(line_of(text, R"(computron_gpulet_busy_seconds_total{device="1",lane="0"})") ==
        R"(computron_gpulet_busy_seconds_total{device="1",lane="0"} 0.75)");
  // A lane no batch ran on shows 0 from the start.
  CHECK(line_of(text, R"(computron_gpulet_busy_seconds_total{device="0",lane="0"})") ==
        R"(computron_gpulet_busy_seconds_total{device="0",lane="0"} 0)");

  // A re-plan makes device 0 whole: lane 1's share goes, its busy seconds stay.
  m.gpulets({{100}, {100}});
  text = "\n" + m.render();
  CHECK(line_of(text, R"(computron_gpulet_share{device="0",lane="0"})") ==
        R"(computron_gpulet_share{device="0",lane="0"} 100)");
  CHECK(line_of(text, R"(computron_gpulet_share{device="0",lane="1"})").empty());
  CHECK(line_of(text, R"(computron_gpulet_busy_seconds_total{device="0",lane="1"})") ==
        R"(computron_gpulet_busy_seconds_total{device="0",lane="1"} 0.75)");
}

TEST_CASE(
    "per-request metrics count into the series found once, and a made-up model name "
    "costs one counter",
    "[net][metrics]") {
  // The metrics keep each model's series after the first lookup (metrics.cpp series_of):
  // repeated requests must land in the same series, and a request refused before anyone
  // knew whether its model exists must not create that name's whole set.
  net::metrics m;
  m.model_registered("a", {0});
  for (int i = 0; i < 3; ++i) {
    m.request_done("a", "ok", 0.02);
    m.http_response("/v1/completions", 200);
  }
  m.request_done("a", "error", 0);
  m.request_done("nope", "overloaded", 0);
  auto text = "\n" + m.render();
  INFO(text);
  CHECK(line_of(text, R"(computron_requests_total{model="a",outcome="ok"})") ==
        R"(computron_requests_total{model="a",outcome="ok"} 3)");
  CHECK(line_of(text, R"(computron_requests_total{model="a",outcome="error"})") ==
        R"(computron_requests_total{model="a",outcome="error"} 1)");
  CHECK(line_of(text, R"(computron_request_latency_seconds_count{model="a"})") ==
        R"(computron_request_latency_seconds_count{model="a"} 3)");
  CHECK(line_of(text, R"(computron_http_responses_total{code="200",route="/v1/completions"})") ==
        R"(computron_http_responses_total{code="200",route="/v1/completions"} 3)");
  CHECK(line_of(text, R"(computron_requests_total{model="nope",outcome="overloaded"})") ==
        R"(computron_requests_total{model="nope",outcome="overloaded"} 1)");
  // That counter is the only series of the made-up name.
  size_t nope = 0;
  for (auto at = text.find("\"nope\""); at != std::string::npos; at = text.find("\"nope\"", at + 1))
    ++nope;
  CHECK(nope == 1);
}
