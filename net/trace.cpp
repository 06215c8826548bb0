#include "net/trace.hpp"

#include <fstream>
#include <set>
#include <utility>

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

namespace {

/// Tracks of a device's gpu-lets past lane 0 take ids from here on (lane 0 keeps the
/// device's own id, so a device that is not split looks as it did before gpu-lets).
constexpr int32_t lane_track_stride = 10000;

int32_t track_id(int32_t device, int32_t lane) {
  return device + lane * lane_track_stride;
}

}  // namespace

void trace_recorder::gpulets(const std::vector<std::vector<int32_t>>& partitions) {
  std::lock_guard<std::mutex> guard{mtx_};
  partitions_ = partitions;
}

void trace_recorder::batch_done(const std::string& model, const std::vector<int32_t>& devices,
                                const std::vector<int32_t>& lanes, size_t rows, double start_s,
                                double seconds) {
  std::vector<std::vector<int32_t>> parts;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    parts = partitions_;
  }
  for (size_t k = 0; k < devices.size(); ++k) {
    auto d = devices[k];
    auto lane = k < lanes.size() ? lanes[k] : 0;
    nlohmann::json args{{"rows", rows}};
    // On a split device the span says which gpu-let it ran on and the share it had then
    // (a re-plan moves a model only once its batches ended).
    auto p =
        d >= 0 && static_cast<size_t>(d) < parts.size() ? &parts[static_cast<size_t>(d)] : nullptr;
    if (lane > 0 || (p && p->size() > 1)) {
      args["gpu-let"] = lane;
      if (p && lane >= 0 && static_cast<size_t>(lane) < p->size())
        args["share"] = (*p)[static_cast<size_t>(lane)];
    }
    add({"batch " + model, "batch", d, lane, start_s, seconds, args.dump()});
  }
}

void trace_recorder::transfer_done(const std::string& model, int32_t device, bool load,
                                   uint64_t bytes, double start_s, double seconds) {
  nlohmann::json args{{"bytes", bytes}};
  if (load && seconds > 0) args["gbps"] = static_cast<double>(bytes) / seconds / 1e9;
  add({(load ? "load " : "evict ") + model, load ? "load" : "evict", device, 0, start_s, seconds,
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
          0,
          actors::now_s(),
          0,
          args.dump()};
  e.phase = "C";
  add(std::move(e));
}

std::string trace_recorder::to_json() const {
  nlohmann::json events = nlohmann::json::array();
  // Every (device, lane) with a track, and the devices split into gpu-lets.
  std::set<std::pair<int32_t, int32_t>> tracks;
  std::set<int32_t> split;
  {
    std::lock_guard<std::mutex> guard{mtx_};
    for (size_t d = 0; d < partitions_.size(); ++d)
      if (partitions_[d].size() > 1) split.insert(static_cast<int32_t>(d));
    for (auto& e : events_) {
      tracks.insert({e.device, e.lane});
      if (e.lane != 0) split.insert(e.device);
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
                        {"tid", track_id(e.device, e.lane)},
                        {"ts", e.start_s * 1e6},
                        {"dur", e.seconds * 1e6},
                        {"args", nlohmann::json::parse(e.args)}});
    }
  }
  for (auto [d, lane] : tracks) {
    auto name = "device " + std::to_string(d);
    if (split.count(d)) name += " \u00b7 gpu-let " + std::to_string(lane);
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", track_id(d, lane)},
                      {"args", {{"name", name}}}});
    // A device's gpu-lets sit together, in device order (their ids would put lanes past
    // 0 after every device); only where some device is split, so that a timeline without
    // gpu-lets stays as it was.
    if (!split.empty())
      events.push_back({{"name", "thread_sort_index"},
                        {"ph", "M"},
                        {"pid", 1},
                        {"tid", track_id(d, lane)},
                        {"args", {{"sort_index", d * lane_track_stride + lane}}}});
  }
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
