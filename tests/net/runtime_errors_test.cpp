#include <catch2/catch.hpp>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

#include "actors/engine.hpp"
#include "actors/node.hpp"
#include "common/error.hpp"
#include "net/client/http_client.hpp"
#include "net/http/http_server.hpp"

// Failures inside the runtime reach a client as 5xx with their message, never as a 400:
// a device error raised by a shard's compute, and a step whose join times out. The whole
// stack in process (emulated devices, the real actors, the real HTTP server on 127.0.0.1),
// with an engine that fails on purpose.

using namespace computron;
using namespace computron::actors;
using namespace std::chrono_literals;
using json = nlohmann::json;

namespace {

/// The toy model, except that "broken-*" models fail every step with a device error and
/// "slow-*" models take 1.5 s per step.
class faulty_engine final : public model_kind {
 public:
  caf::error validate(const model_config& cfg,
                      const std::vector<gpu::device_kind>& placed) const override {
    return toy_->validate(cfg, placed);
  }
  int64_t vocab(const model_config& cfg) const override { return toy_->vocab(cfg); }
  int64_t max_positions(const model_config& cfg) const override { return toy_->max_positions(cfg); }
  caf::expected<gpu::tensor_table> layout(const shard_spec& s) const override {
    return toy_->layout(s);
  }
  caf::error fill(const shard_spec& s, gpu::weight_shard& w) const override {
    return toy_->fill(s, w);
  }
  caf::expected<std::unique_ptr<backend>> make_backend(const shard_spec& s, gpu::weight_shard& w,
                                                       gpu::collective& g) const override {
    auto inner = toy_->make_backend(s, w, g);
    if (!inner) return inner.error();
    return std::unique_ptr<backend>{new program(s.model.name, s.pp_rank, std::move(*inner))};
  }

 private:
  class program final : public backend {
   public:
    program(std::string model, int32_t stage, std::unique_ptr<backend> inner)
        : model_(std::move(model)), stage_(stage), inner_(std::move(inner)) {}
    caf::expected<models::host_tensor> run(const engine::step_input& req,
                                           const std::vector<int32_t>& keep,
                                           const std::vector<std::vector<uint32_t>>& tables,
                                           const models::host_tensor* hidden,
                                           const std::vector<models::device_draw>* draws) override {
      if (model_.rfind("broken", 0) == 0)
        return make_error(ec::device_error,
                          "uncorrectable ECC error in stage " + std::to_string(stage_));
      if (model_.rfind("slow", 0) == 0) std::this_thread::sleep_for(1500ms);
      return inner_->run(req, keep, tables, hidden, draws);
    }
    void end_batch(uint64_t batch_id) override { inner_->end_batch(batch_id); }

   private:
    std::string model_;
    int32_t stage_;
    std::unique_ptr<backend> inner_;
  };

  std::shared_ptr<const model_kind> toy_ = make_toy_engine();
};

model_config faulty(const std::string& name, int32_t device) {
  model_config m;
  m.name = name;
  m.kind = "faulty";
  m.devices = {device};
  m.toy_shard_bytes = 1 << 16;
  return m;
}

}  // namespace

TEST_CASE("runtime failures reach HTTP as 5xx with their message", "[net][errors]") {
  system_config cfg;
  caf::actor_system sys{cfg};
  runtime_options o;
  o.devices.kind = "emulated";
  o.devices.count = 2;
  o.devices.emulated_capacity_bytes = 1 << 20;
  o.devices.emulated_link_gbps = 1.0;
  o.manager.batching.batch_window = 0ms;
  // A step that has not answered in 300 ms has failed.
  o.manager.step_timeout = 300ms;
  auto engines = torch_free_engines();
  engines["faulty"] = std::make_shared<faulty_engine>();
  auto rt = start_runtime(sys, o, engines);
  REQUIRE(rt);
  {
    caf::scoped_actor self{sys};
    // The slow model computes on a device of its own, which stays busy after the timeout.
    for (auto [name, device] : {std::pair{"broken-a", 0}, {"slow-a", 1}, {"fine-a", 0}}) {
      bool ok = false;
      self->request(rt->registry, 30s, register_atom_v, faulty(name, device))
          .receive([&](model_info&) { ok = true; }, [&](caf::error& e) { FAIL(render(e)); });
      REQUIRE(ok);
    }
  }
  net::http_options h;
  h.port = 0;
  auto srv = net::http_server::start(sys, rt->frontend, nullptr, nullptr, h);
  REQUIRE(srv);
  auto client = net::http_client::connect("127.0.0.1", (*srv)->port(), 5s);
  REQUIRE(client);
  auto infer = [&](const std::string& model) {
    json body{
        {"inputs",
         {{{"name", "input_ids"}, {"datatype", "INT64"}, {"shape", {1, 3}}, {"data", {1, 2, 3}}}}}};
    auto r = (*client)->request("POST", "/v2/models/" + model + "/infer", body.dump(), 20s);
    REQUIRE(r);
    return *r;
  };

  auto fine = infer("fine-a");
  CHECK(fine.status == 200);

  // A model that does not exist will not exist after a wait either.
  auto unknown = infer("nope");
  CHECK(unknown.status == 404);
  CHECK(unknown.retry_after.empty());

  // The device's error keeps its code through worker, manager and frontend: a 500 that
  // says what happened, not a 400 blaming the request.
  auto broken = infer("broken-a");
  CHECK(broken.status == 500);
  // Sent again, it meets the same device error: no Retry-After invites that.
  CHECK(broken.retry_after.empty());
  CHECK_THAT(broken.body, Catch::Contains("device_error"));
  CHECK_THAT(broken.body, Catch::Contains("uncorrectable ECC error in stage 0"));
  CHECK_THAT(broken.body, Catch::Contains("broken-a"));

  // A join that times out is a 503 with Retry-After and names the model and the step.
  // Loaded first: a first step on a loading model may also wait for the load.
  {
    caf::scoped_actor self{sys};
    self->request(rt->manager, 30s, load_atom_v, std::string{"slow-a"})
        .receive([](model_info&) {}, [&](caf::error& e) { FAIL(render(e)); });
  }
  auto slow = infer("slow-a");
  CHECK(slow.status == 503);
  CHECK(slow.retry_after == "1");
  CHECK_THAT(slow.body, Catch::Contains("slow-a"));
  CHECK_THAT(slow.body, Catch::Contains("request_timeout: model slow-a step 0 (rank 0): no answer "
                                        "within 300 ms"));

  // And the server still serves.
  CHECK(infer("fine-a").status == 200);
  (*srv)->stop();
  rt->shutdown();
}
