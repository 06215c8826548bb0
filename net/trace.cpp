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

void trace_recorder::device_usage(int32_t device, uint64_t used_bytes, uint64_t, size_t) {
  std::lock_guard<std::mutex> guard{mtx_};
  weights_[device] = used_bytes;
}

void trace_recorder::kv_device(int32_t device, uint64_t kv_bytes, uint64_t free_bytes) {
  constexpr double mib = 1 << 20;
  uint64_t weights = 0;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    weights = weights_[device];
  }
  nlohmann::json args{{"weights MiB", static_cast<double>(weights) / mib},
                      {"KV MiB", static_cast<double>(kv_bytes) / mib},
                      {"free MiB", static_cast<double>(free_bytes) / mib}};
  event e{"memory of device " + std::to_string(device),
          "memory",
          device,
          actors::now_s(),
          0,
          args.dump()};
  e.phase = "C";
  add(std::move(e));
}

std::string trace_recorder::to_json() const {
  nlohmann::json events = nlohmann::json::array();
  std::set<int32_t> devices;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    for (auto& e : events_) {
      devices.insert(e.device);
      if (e.phase[0] == 'C') {
        events.push_back({{"name", e.name},
                          {"cat", e.category},
                          {"ph", "C"},
                          {"pid", 1},
                          {"ts", e.start_s * 1e6},
                          {"args", nlohmann::json::parse(e.args)}});
        continue;
      }
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
