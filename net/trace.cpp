#include "net/trace.hpp"

#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

namespace computron::net {

void trace_recorder::clear() {
  std::lock_guard<std::mutex> guard{mtx_};
  events_.clear();
}

void trace_recorder::add(event e) {
  std::lock_guard<std::mutex> guard{mtx_};
  events_.push_back(std::move(e));
  while (events_.size() > max_events_) events_.pop_front();
}

void trace_recorder::batch_done(const std::string& model, const std::vector<int32_t>& devices,
                                size_t rows, double start_s, double seconds) {
  for (auto d : devices)
    add({"batch " + model, "batch", d, start_s, seconds, nlohmann::json{{"rows", rows}}.dump()});
}

void trace_recorder::transfer_done(const std::string& model, int32_t device, bool load,
                                   uint64_t bytes, double start_s, double seconds) {
  nlohmann::json args{{"bytes", bytes}};
  if (load && seconds > 0) args["gbps"] = static_cast<double>(bytes) / seconds / 1e9;
  add({(load ? "load " : "evict ") + model, load ? "load" : "evict", device, start_s, seconds,
       args.dump()});
}

std::string trace_recorder::to_json() const {
  nlohmann::json events = nlohmann::json::array();
  std::set<int32_t> devices;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    for (auto& e : events_) {
      devices.insert(e.device);
      events.push_back({{"name", e.name},
                        {"cat", e.category},
                        {"ph", "X"},
                        {"pid", 1},
                        {"tid", e.device},
                        {"ts", e.start_s * 1e6},
                        {"dur", e.seconds * 1e6},
                        {"args", nlohmann::json::parse(e.args)}});
    }
  }
  for (auto d : devices)
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", d},
                      {"args", {{"name", "device " + std::to_string(d)}}}});
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"args", {{"name", "computron"}}}});
  // now_s lets a client on another clock (loadgen) line the events up with its own.
  return nlohmann::json{{"traceEvents", events},
                        {"displayTimeUnit", "ms"},
                        {"otherData", {{"now_s", actors::now_s()}}}}
      .dump();
}

bool trace_recorder::write(const std::string& path) const {
  std::ofstream out{path};
  if (!out) return false;
  out << to_json();
  return static_cast<bool>(out);
}

}  // namespace computron::net
