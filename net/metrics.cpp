#include "net/metrics.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace computron::net {

namespace pm = prometheus;

struct metrics::impl {
  std::shared_ptr<pm::Registry> reg = std::make_shared<pm::Registry>();
  pm::Family<pm::Counter>& requests = pm::BuildCounter()
                                          .Name("computron_requests_total")
                                          .Help("Requests that ended, by model and outcome")
                                          .Register(*reg);
  pm::Family<pm::Histogram>& latency =
      pm::BuildHistogram()
          .Name("computron_request_latency_seconds")
          .Help("Time from admission to reply of successful requests")
          .Register(*reg);
  pm::Family<pm::Gauge>& queue = pm::BuildGauge()
                                     .Name("computron_queue_depth")
                                     .Help("Requests waiting in a model's queue")
                                     .Register(*reg);
  pm::Family<pm::Gauge>& resident = pm::BuildGauge()
                                        .Name("computron_resident_models")
                                        .Help("Models resident on their devices")
                                        .Register(*reg);
  pm::Family<pm::Gauge>& used =
      pm::BuildGauge()
          .Name("computron_device_used_bytes")
          .Help("Device bytes held by model weights (loading or resident)")
          .Register(*reg);
  pm::Family<pm::Gauge>& mapped =
      pm::BuildGauge()
          .Name("computron_device_mapped_bytes")
          .Help(
              "Device bytes of pages the device itself has mapped (weights and KV), after "
              "its last load or eviction: used plus KV bytes never count less")
          .Register(*reg);
  pm::Family<pm::Gauge>& kv_used = pm::BuildGauge()
                                       .Name("computron_kv_used_bytes")
                                       .Help("Device bytes held by running batches' KV blocks")
                                       .Register(*reg);
  pm::Family<pm::Gauge>& device_free =
      pm::BuildGauge()
          .Name("computron_device_free_bytes")
          .Help("Device bytes neither weights nor KV blocks hold (of the capacity)")
          .Register(*reg);
  pm::Family<pm::Gauge>& kv_blocks = pm::BuildGauge()
                                         .Name("computron_kv_blocks")
                                         .Help(
                                             "KV blocks a model's running batches hold "
                                             "(on each of its shards; 16 tokens each)")
                                         .Register(*reg);
  pm::Family<pm::Counter>& preemptions =
      pm::BuildCounter()
          .Name("computron_preemptions_total")
          .Help("Running requests preempted for KV room (recomputed later), by model")
          .Register(*reg);
  pm::Family<pm::Counter>& prefill_chunks =
      pm::BuildCounter()
          .Name("computron_prefill_chunks_total")
          .Help(
              "Chunks of joiners' prompts run as steps of their own between a running "
              "batch's steps (chunked prefill), by model")
          .Register(*reg);
  pm::Family<pm::Counter>& prefill_chunk_tokens =
      pm::BuildCounter()
          .Name("computron_prefill_chunk_tokens_total")
          .Help("Prompt tokens computed in those chunks, by model")
          .Register(*reg);
  pm::Family<pm::Gauge>& capacity = pm::BuildGauge()
                                        .Name("computron_device_capacity_bytes")
                                        .Help("Device bytes available to model weights")
                                        .Register(*reg);
  pm::Family<pm::Gauge>& device_models = pm::BuildGauge()
                                             .Name("computron_device_resident_models")
                                             .Help("Models with a resident shard on the device")
                                             .Register(*reg);
  pm::Family<pm::Counter>& loads = pm::BuildCounter()
                                       .Name("computron_shard_loads_total")
                                       .Help("Shard loads, by device")
                                       .Register(*reg);
  pm::Family<pm::Counter>& evictions = pm::BuildCounter()
                                           .Name("computron_shard_evictions_total")
                                           .Help("Shard evictions, by device")
                                           .Register(*reg);
  pm::Family<pm::Histogram>& load_seconds = pm::BuildHistogram()
                                                .Name("computron_load_seconds")
                                                .Help("Time of one shard's load, by device")
                                                .Register(*reg);
  pm::Family<pm::Histogram>& evict_seconds = pm::BuildHistogram()
                                                 .Name("computron_evict_seconds")
                                                 .Help("Time of one shard's eviction, by device")
                                                 .Register(*reg);
  pm::Family<pm::Counter>& bytes_loaded = pm::BuildCounter()
                                              .Name("computron_bytes_loaded_total")
                                              .Help("Bytes copied host to device, by device")
                                              .Register(*reg);
  pm::Family<pm::Gauge>& gbps = pm::BuildGauge()
                                    .Name("computron_load_gbps")
                                    .Help("Achieved GB/s (1e9 bytes) of the device's last load")
                                    .Register(*reg);
  pm::Family<pm::Counter>& batches = pm::BuildCounter()
                                         .Name("computron_batches_total")
                                         .Help("Batches run, by model")
                                         .Register(*reg);
  pm::Family<pm::Histogram>& batch_rows =
      pm::BuildHistogram().Name("computron_batch_size").Help("Sequences per batch").Register(*reg);
  // Per model and device, so a dashboard shows which models thrash.
  pm::Family<pm::Counter>& model_loads = pm::BuildCounter()
                                             .Name("computron_model_loads_total")
                                             .Help("Shard loads, by model and device")
                                             .Register(*reg);
  pm::Family<pm::Counter>& model_evictions = pm::BuildCounter()
                                                 .Name("computron_model_evictions_total")
                                                 .Help("Shard evictions, by model and device")
                                                 .Register(*reg);
  pm::Family<pm::Counter>& model_load_seconds =
      pm::BuildCounter()
          .Name("computron_model_load_seconds_total")
          .Help("Seconds spent loading shards, by model and device")
          .Register(*reg);
  // Where each model stands (a LoRA adapter too, under its own name): its shards on the
  // devices now, loads up and evictions down.
  pm::Family<pm::Gauge>& model_resident = pm::BuildGauge()
                                              .Name("computron_model_resident_shards")
                                              .Help("Shards of the model on its devices now")
                                              .Register(*reg);
  pm::Family<pm::Counter>& model_bytes = pm::BuildCounter()
                                             .Name("computron_model_bytes_loaded_total")
                                             .Help("Bytes loaded, by model and device")
                                             .Register(*reg);
  // The series LLM operators chart, with vLLM's meanings (per model).
  pm::Family<pm::Histogram>& ttft = pm::BuildHistogram()
                                        .Name("computron_time_to_first_token_seconds")
                                        .Help("From a request's arrival to its first token")
                                        .Register(*reg);
  pm::Family<pm::Histogram>& itl =
      pm::BuildHistogram()
          .Name("computron_inter_token_latency_seconds")
          .Help("Between consecutive tokens of a request (time per output token)")
          .Register(*reg);
  pm::Family<pm::Histogram>& e2e = pm::BuildHistogram()
                                       .Name("computron_e2e_request_latency_seconds")
                                       .Help(
                                           "From a request's arrival to its answer, for "
                                           "requests that ran")
                                       .Register(*reg);
  pm::Family<pm::Histogram>& queue_time = pm::BuildHistogram()
                                              .Name("computron_request_queue_time_seconds")
                                              .Help("Time a request waited in its model's queue")
                                              .Register(*reg);
  pm::Family<pm::Histogram>& swap_wait =
      pm::BuildHistogram()
          .Name("computron_request_swap_wait_seconds")
          .Help("Time a request's batch waited for its model's load (0 when resident)")
          .Register(*reg);
  pm::Family<pm::Counter>& prompt_tokens = pm::BuildCounter()
                                               .Name("computron_prompt_tokens_total")
                                               .Help("Prompt tokens of requests that ran")
                                               .Register(*reg);
  pm::Family<pm::Counter>& generation_tokens = pm::BuildCounter()
                                                   .Name("computron_generation_tokens_total")
                                                   .Help("Tokens generated")
                                                   .Register(*reg);
  pm::Family<pm::Gauge>& running = pm::BuildGauge()
                                       .Name("computron_requests_running")
                                       .Help(
                                           "Rows of a model's batches running now (waiting: "
                                           "computron_queue_depth)")
                                       .Register(*reg);
  pm::Family<pm::Counter>& http = pm::BuildCounter()
                                      .Name("computron_http_responses_total")
                                      .Help("HTTP responses by status code and route family")
                                      .Register(*reg);
  // Gpu-lets (compute lanes with a share of a device's SMs): what each lane has, and how
  // long batches kept it busy, so a dashboard shows which lane is the bottleneck.
  pm::Family<pm::Gauge>& gpulet_share =
      pm::BuildGauge()
          .Name("computron_gpulet_share")
          .Help(
              "Percent of the device's SMs its gpu-let (compute lane) has; a device not "
              "split is lane 0 at 100")
          .Register(*reg);
  pm::Family<pm::Counter>& gpulet_busy =
      pm::BuildCounter()
          .Name("computron_gpulet_busy_seconds_total")
          .Help(
              "Seconds batches ran on the gpu-let, summed over its batches (a batch on "
              "several devices counts on the lane of each)")
          .Register(*reg);
  // The same series under vLLM's names and label (model_name), so that dashboards and
  // alerts built for vLLM read this server (docs/design/metrics.md of vLLM, v1 engine).
  pm::Family<pm::Gauge>& v_running = pm::BuildGauge()
                                         .Name("vllm:num_requests_running")
                                         .Help("Number of requests in model execution batches")
                                         .Register(*reg);
  pm::Family<pm::Gauge>& v_waiting = pm::BuildGauge()
                                         .Name("vllm:num_requests_waiting")
                                         .Help("Number of requests waiting to be processed")
                                         .Register(*reg);
  pm::Family<pm::Gauge>& v_kv_usage =
      pm::BuildGauge()
          .Name("vllm:kv_cache_usage_perc")
          .Help(
              "KV-cache usage, 1 is 100 percent: of the device memory KV blocks may use "
              "(what they hold plus what is free), the share they hold, on the model's "
              "fullest device")
          .Register(*reg);
  pm::Family<pm::Counter>& v_preemptions = pm::BuildCounter()
                                               .Name("vllm:num_preemptions_total")
                                               .Help("Cumulative number of preemptions")
                                               .Register(*reg);
  pm::Family<pm::Counter>& v_prompt_tokens = pm::BuildCounter()
                                                 .Name("vllm:prompt_tokens_total")
                                                 .Help("Number of prefill tokens processed")
                                                 .Register(*reg);
  pm::Family<pm::Counter>& v_generation_tokens = pm::BuildCounter()
                                                     .Name("vllm:generation_tokens_total")
                                                     .Help("Number of generation tokens processed")
                                                     .Register(*reg);
  pm::Family<pm::Counter>& v_success = pm::BuildCounter()
                                           .Name("vllm:request_success_total")
                                           .Help("Count of successfully processed requests")
                                           .Register(*reg);
  pm::Family<pm::Histogram>& v_request_prompt =
      pm::BuildHistogram()
          .Name("vllm:request_prompt_tokens")
          .Help("Number of prefill tokens processed, per request")
          .Register(*reg);
  pm::Family<pm::Histogram>& v_request_generation =
      pm::BuildHistogram()
          .Name("vllm:request_generation_tokens")
          .Help("Number of generation tokens processed, per request")
          .Register(*reg);
  pm::Family<pm::Histogram>& v_ttft = pm::BuildHistogram()
                                          .Name("vllm:time_to_first_token_seconds")
                                          .Help("Histogram of time to first token in seconds")
                                          .Register(*reg);
  pm::Family<pm::Histogram>& v_itl = pm::BuildHistogram()
                                         .Name("vllm:inter_token_latency_seconds")
                                         .Help("Histogram of inter-token latency in seconds")
                                         .Register(*reg);
  pm::Family<pm::Histogram>& v_e2e = pm::BuildHistogram()
                                         .Name("vllm:e2e_request_latency_seconds")
                                         .Help("Histogram of end to end request latency in seconds")
                                         .Register(*reg);
  pm::Family<pm::Histogram>& v_queue =
      pm::BuildHistogram()
          .Name("vllm:request_queue_time_seconds")
          .Help("Histogram of time spent in WAITING phase for request")
          .Register(*reg);
  pm::Family<pm::Histogram>& v_prefill =
      pm::BuildHistogram()
          .Name("vllm:request_prefill_time_seconds")
          .Help(
              "Histogram of time spent in PREFILL phase for request (from leaving the "
              "queue to the first token, a swap's wait included)")
          .Register(*reg);
  pm::Family<pm::Histogram>& v_decode = pm::BuildHistogram()
                                            .Name("vllm:request_decode_time_seconds")
                                            .Help("Histogram of time spent in DECODE phase")
                                            .Register(*reg);
  /// Each model's devices (model_registered), and each device's KV use, for the usage gauge.
  std::mutex kv_mtx;
  std::map<std::string, std::vector<int32_t>> devices_of{};
  std::map<int32_t, double> kv_share{};
  /// The share gauges now shown, by device and lane: a re-plan that drops a lane removes
  /// its gauge (its busy counter stays, as counters do).
  std::mutex gpulets_mtx;
  std::map<std::pair<int32_t, int32_t>, pm::Gauge*> shares{};
  /// The series a request or a batch updates, by model, found once (series_of): Family::Add
  /// builds a whole metric, a histogram's buckets and all, before it looks its labels up,
  /// which cost more per request than everything else the metrics do (bench runtime).
  /// Families never remove a model's series, so the pointers stay valid.
  struct model_series;
  model_series& series_of(const std::string& model);
  /// `key`'s counter in `m`, added to `family` under `labels()` the first time.
  template <class Map, class Labels>
  pm::Counter& counter_in(Map& m, const typename Map::key_type& key,
                          pm::Family<pm::Counter>& family, Labels labels) {
    std::lock_guard<std::mutex> guard{series_mtx};
    auto& c = m[key];
    if (!c) c = &family.Add(labels());
    return *c;
  }
  std::mutex series_mtx;
  std::unordered_map<std::string, std::unique_ptr<model_series>> series{};
  std::map<std::pair<int, std::string>, pm::Counter*> http_codes{};
  std::map<std::pair<std::string, std::string>, pm::Counter*> outcomes{};
  pm::Gauge& resident_gauge = resident.Add({});
  pm::Histogram& rows_hist =
      batch_rows.Add({}, pm::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64});
};

namespace {

// vLLM's buckets, so dashboards built for it read ours.
const pm::Histogram::BucketBoundaries ttft_b{0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                             0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                             20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const pm::Histogram::BucketBoundaries itl_b{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                            0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                            7.5,  10.0,  20.0, 40.0,  80.0};
const pm::Histogram::BucketBoundaries e2e_b{0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                            5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                            60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
/// Token counts: 1, 2, 5, 10, 20, 50, ... as vLLM's (which stop at the model's context;
/// these at 10^7, past any context served here).
const pm::Histogram::BucketBoundaries tokens_b = [] {
  pm::Histogram::BucketBoundaries b;
  for (double m = 1; m <= 1e7; m *= 10)
    for (double k : {1.0, 2.0, 5.0}) b.push_back(k * m);
  return b;
}();

pm::Labels vllm_labels(const std::string& model) {
  return {{"model_name", model}};
}

}  // namespace

struct metrics::impl::model_series {
  pm::Gauge *queue, *v_waiting, *running, *v_running;
  pm::Histogram *latency, *ttft, *itl, *e2e, *queue_time, *swap_wait;
  pm::Counter *prompt_tokens, *generation_tokens, *batches;
  pm::Histogram *v_ttft, *v_prefill, *v_decode, *v_itl, *v_e2e, *v_queue, *v_request_prompt,
      *v_request_generation;
  pm::Counter *v_prompt_tokens, *v_generation_tokens;
  /// By finish reason (vLLM's successes).
  std::map<std::string, pm::Counter*> reasons{};
};

metrics::impl::model_series& metrics::impl::series_of(const std::string& model) {
  auto& i = *this;
  std::lock_guard<std::mutex> guard{i.series_mtx};
  auto& s = i.series[model];
  if (s) return *s;
  pm::Labels l{{"model", model}};
  auto v = vllm_labels(model);
  s.reset(new model_series{
      &i.queue.Add(l),
      &i.v_waiting.Add(v),
      &i.running.Add(l),
      &i.v_running.Add(v),
      &i.latency.Add(l, pm::Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                                        2.5, 5, 10, 30}),
      &i.ttft.Add(l, ttft_b),
      &i.itl.Add(l, itl_b),
      &i.e2e.Add(l, e2e_b),
      &i.queue_time.Add(l, e2e_b),
      &i.swap_wait.Add(l, ttft_b),
      &i.prompt_tokens.Add(l),
      &i.generation_tokens.Add(l),
      &i.batches.Add(l),
      &i.v_ttft.Add(v, ttft_b),
      &i.v_prefill.Add(v, e2e_b),
      &i.v_decode.Add(v, e2e_b),
      &i.v_itl.Add(v, itl_b),
      &i.v_e2e.Add(v, e2e_b),
      &i.v_queue.Add(v, e2e_b),
      &i.v_request_prompt.Add(v, tokens_b),
      &i.v_request_generation.Add(v, tokens_b),
      &i.v_prompt_tokens.Add(v),
      &i.v_generation_tokens.Add(v)});
  return *s;
}

metrics::metrics() : impl_(std::make_unique<impl>()) {}

metrics::~metrics() = default;

std::string metrics::render() const {
  std::ostringstream os;
  pm::TextSerializer{}.Serialize(os, impl_->reg->Collect());
  return os.str();
}

void metrics::request_done(const std::string& model, const std::string& outcome, double seconds) {
  // Not through series_of: the frontend counts an overloaded request before it knows
  // whether its model exists, and a made-up name must cost one counter, not every series.
  impl_
      ->counter_in(impl_->outcomes, {model, outcome}, impl_->requests,
                   [&] {
                     return pm::Labels{{"model", model}, {"outcome", outcome}};
                   })
      .Increment();
  if (outcome == "ok") impl_->series_of(model).latency->Observe(seconds);
}

void metrics::queue_depth(const std::string& model, size_t depth) {
  auto& m = impl_->series_of(model);
  m.queue->Set(static_cast<double>(depth));
  m.v_waiting->Set(static_cast<double>(depth));
}

void metrics::running_requests(const std::string& model, size_t rows) {
  auto& m = impl_->series_of(model);
  m.running->Set(static_cast<double>(rows));
  m.v_running->Set(static_cast<double>(rows));
}

void metrics::request_timeline(const std::string& model, const actors::request_timeline& t) {
  auto& m = impl_->series_of(model);
  if (t.ttft_s >= 0) {
    m.ttft->Observe(t.ttft_s);
    m.v_ttft->Observe(t.ttft_s);
    m.v_prefill->Observe(std::max(0.0, t.ttft_s - t.queue_s));
    m.v_decode->Observe(std::max(0.0, t.e2e_s - t.ttft_s));
  }
  for (auto s : t.itl_s) {
    m.itl->Observe(s);
    m.v_itl->Observe(s);
  }
  m.e2e->Observe(t.e2e_s);
  m.queue_time->Observe(t.queue_s);
  m.swap_wait->Observe(t.swap_s);
  m.prompt_tokens->Increment(static_cast<double>(t.prompt_tokens));
  m.generation_tokens->Increment(static_cast<double>(t.generation_tokens));
  m.v_e2e->Observe(t.e2e_s);
  m.v_queue->Observe(t.queue_s);
  m.v_prompt_tokens->Increment(static_cast<double>(t.prompt_tokens));
  m.v_generation_tokens->Increment(static_cast<double>(t.generation_tokens));
  m.v_request_prompt->Observe(static_cast<double>(t.prompt_tokens));
  m.v_request_generation->Observe(static_cast<double>(t.generation_tokens));
  auto reason = t.finish_reason == "cancelled" ? std::string{"abort"} : t.finish_reason;
  if (!reason.empty())
    impl_
        ->counter_in(m.reasons, reason, impl_->v_success,
                     [&] {
                       return pm::Labels{{"model_name", model}, {"finished_reason", reason}};
                     })
        .Increment();
}

void metrics::http_response(const std::string& route, int status) {
  impl_
      ->counter_in(impl_->http_codes, {status, route}, impl_->http,
                   [&] {
                     return pm::Labels{{"code", std::to_string(status)}, {"route", route}};
                   })
      .Increment();
}

namespace {

pm::Labels lane_labels(int32_t device, int32_t lane) {
  return {{"device", std::to_string(device)}, {"lane", std::to_string(lane)}};
}

}  // namespace

void metrics::batch_done(const std::string& model, const std::vector<int32_t>& devices,
                         const std::vector<int32_t>& lanes, size_t rows, double, double seconds) {
  impl_->series_of(model).batches->Increment();
  impl_->rows_hist.Observe(static_cast<double>(rows));
  for (size_t k = 0; k < devices.size(); ++k)
    impl_->gpulet_busy.Add(lane_labels(devices[k], k < lanes.size() ? lanes[k] : 0))
        .Increment(std::max(0.0, seconds));
}

void metrics::gpulets(const std::vector<std::vector<int32_t>>& partitions) {
  std::lock_guard<std::mutex> guard{impl_->gpulets_mtx};
  std::map<std::pair<int32_t, int32_t>, pm::Gauge*> now;
  for (size_t d = 0; d < partitions.size(); ++d)
    for (size_t l = 0; l < partitions[d].size(); ++l) {
      auto device = static_cast<int32_t>(d), lane = static_cast<int32_t>(l);
      auto& g = impl_->gpulet_share.Add(lane_labels(device, lane));
      g.Set(static_cast<double>(partitions[d][l]));
      now[{device, lane}] = &g;
      impl_->gpulet_busy.Add(lane_labels(device, lane));  // shown at 0 before its first batch
    }
  for (auto& [key, gauge] : impl_->shares)
    if (!now.count(key)) impl_->gpulet_share.Remove(gauge);
  impl_->shares = std::move(now);
}

void metrics::model_registered(const std::string& model, const std::vector<int32_t>& devices) {
  // Every series of a model from its registration on, at 0: a dashboard's rate() and an
  // alert on a counter need the series before its first event.
  auto& i = *impl_;
  i.series_of(model);  // the series each request or batch updates
  pm::Labels l{{"model", model}};
  i.preemptions.Add(l);
  i.prefill_chunks.Add(l);
  i.prefill_chunk_tokens.Add(l);
  auto v = vllm_labels(model);
  i.v_kv_usage.Add(v);
  i.v_preemptions.Add(v);
  for (auto reason : {"stop", "length", "abort"})
    i.v_success.Add({{"model_name", model}, {"finished_reason", reason}});
  {
    std::lock_guard<std::mutex> guard{i.kv_mtx};
    i.devices_of[model] = devices;
  }
  for (auto d : devices) {
    pm::Labels l{{"model", model}, {"device", std::to_string(d)}};
    impl_->model_loads.Add(l);
    impl_->model_evictions.Add(l);
    impl_->model_load_seconds.Add(l);
    impl_->model_bytes.Add(l);
  }
}

void metrics::transfer_done(const std::string& model, int32_t device, bool load, uint64_t bytes,
                            double, double seconds) {
  pm::Labels l{{"device", std::to_string(device)}};
  pm::Labels ml{{"model", model}, {"device", std::to_string(device)}};
  if (!load) {
    impl_->model_resident.Add({{"model", model}}).Decrement();
    impl_->model_evictions.Add(ml).Increment();
    impl_->evictions.Add(l).Increment();
    impl_->evict_seconds.Add(l, pm::Histogram::BucketBoundaries{1e-5, 1e-4, 0.001, 0.01, 0.1, 1})
        .Observe(seconds);
    return;
  }
  impl_->loads.Add(l).Increment();
  impl_->bytes_loaded.Add(l).Increment(static_cast<double>(bytes));
  impl_->model_resident.Add({{"model", model}}).Increment();
  impl_->model_loads.Add(ml).Increment();
  impl_->model_bytes.Add(ml).Increment(static_cast<double>(bytes));
  impl_->model_load_seconds.Add(ml).Increment(seconds);
  impl_->load_seconds
      .Add(l, pm::Histogram::BucketBoundaries{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5})
      .Observe(seconds);
  if (seconds > 0) impl_->gbps.Add(l).Set(static_cast<double>(bytes) / seconds / 1e9);
}

void metrics::device_usage(int32_t device, uint64_t used_bytes, uint64_t capacity_bytes,
                           size_t resident_models) {
  pm::Labels l{{"device", std::to_string(device)}};
  impl_->used.Add(l).Set(static_cast<double>(used_bytes));
  impl_->capacity.Add(l).Set(static_cast<double>(capacity_bytes));
  impl_->device_models.Add(l).Set(static_cast<double>(resident_models));
}

void metrics::preempted(const std::string& model) {
  impl_->preemptions.Add({{"model", model}}).Increment();
  impl_->v_preemptions.Add(vllm_labels(model)).Increment();
}

void metrics::prefill_chunk(const std::string& model, int64_t tokens) {
  impl_->prefill_chunks.Add({{"model", model}}).Increment();
  impl_->prefill_chunk_tokens.Add({{"model", model}}).Increment(static_cast<double>(tokens));
}

void metrics::device_mapped(int32_t device, uint64_t bytes) {
  impl_->mapped.Add({{"device", std::to_string(device)}}).Set(static_cast<double>(bytes));
}

void metrics::kv_device(int32_t device, uint64_t kv_bytes, uint64_t free_bytes) {
  pm::Labels l{{"device", std::to_string(device)}};
  impl_->kv_used.Add(l).Set(static_cast<double>(kv_bytes));
  impl_->device_free.Add(l).Set(static_cast<double>(free_bytes));
  // Each model's usage is its fullest device's: the one whose KV runs out first.
  auto& i = *impl_;
  std::lock_guard<std::mutex> guard{i.kv_mtx};
  auto room = static_cast<double>(kv_bytes) + static_cast<double>(free_bytes);
  i.kv_share[device] = room > 0 ? static_cast<double>(kv_bytes) / room : 0;
  for (auto& [model, devices] : i.devices_of) {
    double share = 0;
    for (auto d : devices)
      if (auto it = i.kv_share.find(d); it != i.kv_share.end()) share = std::max(share, it->second);
    i.v_kv_usage.Add(vllm_labels(model)).Set(share);
  }
}

void metrics::kv_model(const std::string& model, uint64_t blocks) {
  impl_->kv_blocks.Add({{"model", model}}).Set(static_cast<double>(blocks));
}

void metrics::resident_models(size_t count) {
  impl_->resident_gauge.Set(static_cast<double>(count));
}

}  // namespace computron::net
