// Writes the seed corpus of the caf_message fuzz target (tests/fuzz/corpus/caf_message):
// one serialized value of each message shape, prefixed with the byte that selects it.
//   fuzz_caf_seeds DIR
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/message.hpp>

#include "actors/atoms.hpp"
#include "actors/interfaces.hpp"
#include "actors/messages.hpp"

using namespace computron::actors;

namespace {

std::string dir;
caf::actor_system* sys_ptr = nullptr;

template <class T>
void seed(char selector, const std::string& name, T x) {
  std::vector<char> buf{selector};
  caf::binary_serializer out{*sys_ptr, buf};
  if (out(x)) {
    std::fprintf(stderr, "cannot serialize %s\n", name.c_str());
    std::exit(1);
  }
  std::ofstream{dir + "/" + name, std::ios::binary}.write(buf.data(),
                                                          static_cast<std::streamsize>(buf.size()));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  dir = argv[1];
  // Actor handles (step_request's route, infer_request's stream) serialize only with a
  // system at hand, as they do in the middleman.
  caf::actor_system_config cfg;
  cfg.add_message_types<caf::id_block::computron_atoms>();
  cfg.add_message_types<caf::id_block::computron_messages>();
  cfg.add_message_types<caf::id_block::computron_handles>();
  caf::actor_system sys{cfg};
  sys_ptr = &sys;
  model_config m;
  m.name = "opt-a";
  m.spec = "opt-125m";
  m.shape = {768, 12, 12, 3072, 50272, 2048};
  m.devices = {0, 1, 2, 3};
  m.tp = m.pp = 2;
  m.tokenizer = "bytes";
  row_sampling s{0.7, 5, 0.9, 42};
  infer_request r;
  r.model = "opt-a";
  r.tokens = {2, 100, 200};
  r.max_tokens = 4;
  r.sampling = s;
  r.drop_late = true;
  step_request st;
  st.model = "opt-a";
  st.input.plan.batch = 3;
  st.input.plan.rows = {{0, 2, 0, 2, {0}}, {1, 1, 0, 1, {1}}};
  st.input.plan.finished = {9};
  st.input.prompts = {{1, 2}, {3}};
  st.input.sampling = {s, s};
  st.input.plan.kv_spare = 4;
  st.hidden = tensor_payload{2, {1, 2, 4}, std::vector<uint8_t>(16, 7)};
  st.lanes.lanes = {0, 1};
  device_report d;
  d.device = 1;
  d.name = "emulated:1";
  d.kind = "emulated";
  d.shards = {"opt-a"};
  residency_report rr;
  rr.model = "opt-a";
  rr.state = model_lifecycle::resident;
  rr.bytes = 1 << 20;
  model_info info;
  info.config = m;
  info.state = model_lifecycle::resident;
  info.reason = "";
  seed(1, "model_config", m);
  seed(2, "shard_spec", shard_spec{m, 1, 0, "tcp://127.0.0.1:1"});
  seed(3, "shard_report", shard_report{"opt-a", 2, 4096, true});
  seed(4, "transfer_report", transfer_report{"opt-a", 0, 1 << 20, 0.01, 1 << 19});
  seed(5, "row_sampling", s);
  seed(6, "tensor_payload", st.hidden);
  seed(7, "step_request", st);
  seed(8, "step_result", step_result{{7, 8}, 1.5});
  seed(9, "device_reports", std::vector<device_report>{d, d});
  seed(10, "model_placement", model_placement{"opt-a", {0, 1}, {10, 20}, false, 1});
  seed(11, "lease", lease{"opt-a", true, 2.5, 2.0, {"opt-a", "opt-b"}, true});
  seed(12, "residency_reports", std::vector<residency_report>{rr});
  seed(13, "device_usage", std::vector<device_usage>{device_usage{0, 100, 50, 1}});
  seed(14, "infer_request", r);
  seed(15, "model_infos", std::vector<model_info>{info});
  // Whole messages, as the middleman carries them.
  auto msg_seed = [&](const std::string& name, caf::message msg) {
    std::vector<char> buf{0};
    caf::binary_serializer out{sys, buf};
    if (out(msg)) std::exit(1);
    std::ofstream{dir + "/" + name, std::ios::binary}.write(
        buf.data(), static_cast<std::streamsize>(buf.size()));
  };
  msg_seed("message_infer", caf::make_message(computron::atom::infer_atom_v, r));
  msg_seed("message_load", caf::make_message(computron::atom::load_atom_v, std::string{"opt-a"}));
  msg_seed("message_begin_load",
           caf::make_message(computron::atom::begin_load_atom_v, std::string{"opt-a"}));
  msg_seed("message_infos", caf::make_message(std::vector<model_info>{info}));
  return 0;
}
