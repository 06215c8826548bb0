// The serve config: its built-in defaults, and a config file read section by section
// (sections.hpp) in the file's documented order, so the first bad key is the one named.
#include "serve/serve_config.hpp"

#include <chrono>
#include <filesystem>

#include "common/error.hpp"
#include "common/json_file.hpp"
#include "common/log.hpp"
#include "serve/json_fields.hpp"
#include "serve/repository.hpp"
#include "serve/sections.hpp"

namespace computron::serve {

serve_config default_settings() {
  serve_config c;
  c.runtime.devices.kind = "emulated";
  c.runtime.devices.count = 4;
  // Two of the three models' first and last stages (110 and 102 MiB; the middle ones
  // about 50) fit, three do not: the default job swaps.
  c.runtime.devices.emulated_capacity_bytes = 256ull << 20;
  c.runtime.devices.emulated_link_gbps = 2.0;
  c.runtime.manager.batching.max_batch_size = 8;
  c.runtime.manager.batching.batch_window = std::chrono::milliseconds(5);
  return c;
}

namespace {

/// Three seeded OPT-125M models (TP2 x PP2): the defaults where SmolLM2 is not installed.
std::vector<actors::model_config> seeded_models() {
  std::vector<actors::model_config> out;
  for (int i = 0; i < 3; ++i) {
    actors::model_config m;
    m.name = "opt-125m-" + std::string(1, static_cast<char>('a' + i));
    m.kind = "opt";
    m.spec = "opt-125m";
    m.dtype = "bf16";
    m.tp = 2;
    m.pp = 2;
    m.devices = {0, 1, 2, 3};
    m.seed = static_cast<uint64_t>(i + 1);
    // Silent: a config file replaces these models, and says "gpt2" itself where it wants it.
    m.tokenizer = gpt2_tokenizer(false);
    out.push_back(m);
  }
  return out;
}

}  // namespace

std::vector<actors::model_config> builtin_models() {
  // One GGUF file read once (its shape, tokenizer and chat template), served under three
  // names: three models of one size, so that the devices hold two and requests swap.
  auto file = python_package_file(smollm2_file);
  caf::expected<actors::model_config> base =
      file ? read_model_source(*file, "smollm2")
           : caf::expected<actors::model_config>{file.error()};
  if (!base) {
    log::warn(
        "the built-in model SmolLM2-135M-Instruct is not there ({}); serving three "
        "seeded OPT-125M models instead, whose answers are noise",
        render(base.error()));
    return seeded_models();
  }
  std::vector<actors::model_config> out;
  for (char x : {'a', 'b', 'c'}) {
    auto m = *base;
    m.name = std::string{"smollm2-"} + x;
    m.dtype = "bf16";
    m.tp = 1;  // its 9 heads (3 of keys and values) split by 3 at most
    m.pp = 4;
    m.devices = {0, 1, 2, 3};
    out.push_back(std::move(m));
  }
  return out;
}

serve_config default_serve_config() {
  auto c = default_settings();
  c.models = builtin_models();
  // The seeded OPT models' shards are 79 MiB (the vocabulary cut across the ranks): two
  // fit in 192 MiB, three do not.
  if (!c.models.empty() && c.models.front().kind == "opt")
    c.runtime.devices.emulated_capacity_bytes = 192ull << 20;
  return c;
}

caf::expected<serve_config> load_serve_config(const std::string& path,
                                              const std::string& repository,
                                              const std::string& served_name) {
  auto j = read_json_file(path);
  if (!j) return j.error();
  auto base = std::filesystem::path{path}.parent_path();
  auto c = default_settings();
  c.served_name = served_name;
  const std::string& w = path;
  caf::error e;
  if ((e = check_keys(*j, w,
                      {"devices", "http", "scheduler", "batching", "frontend", "repository",
                       "models", "trace_file", "compute_threads", "chunk_mb", "nodes",
                       "node_wait_s", "tls", "console_host", "console_port", "comment"})) ||
      (e = read_devices(*j, w, c)) || (e = read_http(*j, w, c)) || (e = read_scheduler(*j, w, c)) ||
      (e = read_batching(*j, w, c)) || (e = read_frontend(*j, w, c)) ||
      (e = read_controller(*j, w, base, c)) || (e = read_process(*j, w, c)) ||
      (e = read_models(*j, w, base, repository, c)))
    return e;
  return c;
}

}  // namespace computron::serve
