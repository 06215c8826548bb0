// Fuzz target: our actor protocol's messages as bytes from a peer (what CAF's middleman
// hands the deserializer when a node or a console connects). Byte 0 picks the shape: a
// whole caf::message through an actor system that knows our types, or one of our message
// structs through its inspect(). A struct that deserializes must serialize back to the
// same bytes after a second round: inspect() reads and writes the same fields.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include "actors/atoms.hpp"
#include "actors/interfaces.hpp"
#include "actors/messages.hpp"

namespace {

using namespace computron::actors;

caf::actor_system& fuzz_system() {
  static auto* cfg = [] {
    auto* c = new caf::actor_system_config;
    c->add_message_types<caf::id_block::computron_atoms>();
    c->add_message_types<caf::id_block::computron_messages>();
    c->add_message_types<caf::id_block::computron_handles>();
    c->set("scheduler.max-threads", 1);
    return c;
  }();
  static auto* sys = new caf::actor_system{*cfg};
  return *sys;
}

/// Walks a value as a serializer would and fails on a non-finite float: CAF 0.17.6's
/// pack754 (caf/detail/ieee_754.hpp) halves an infinity forever, so serializing one hangs
/// the thread. Bytes from a peer can decode to one (unpack754 of exponent 0x7ff); such a
/// value is not re-serialized here, and our own code never puts one in a message.
class finite_check final : public caf::serializer {
 public:
  explicit finite_check(caf::actor_system& sys) : caf::serializer(sys) {}
  caf::error begin_object(uint16_t&, std::string&) override { return {}; }
  caf::error end_object() override { return {}; }
  caf::error begin_sequence(size_t&) override { return {}; }
  caf::error end_sequence() override { return {}; }
  caf::error apply_raw(size_t, void*) override { return {}; }

 protected:
  caf::error apply_impl(int8_t&) override { return {}; }
  caf::error apply_impl(uint8_t&) override { return {}; }
  caf::error apply_impl(int16_t&) override { return {}; }
  caf::error apply_impl(uint16_t&) override { return {}; }
  caf::error apply_impl(int32_t&) override { return {}; }
  caf::error apply_impl(uint32_t&) override { return {}; }
  caf::error apply_impl(int64_t&) override { return {}; }
  caf::error apply_impl(uint64_t&) override { return {}; }
  caf::error apply_impl(float& x) override { return check(x); }
  caf::error apply_impl(double& x) override { return check(x); }
  caf::error apply_impl(long double& x) override { return check(x); }
  caf::error apply_impl(std::string&) override { return {}; }
  caf::error apply_impl(std::u16string&) override { return {}; }
  caf::error apply_impl(std::u32string&) override { return {}; }

 private:
  template <class F>
  static caf::error check(F x) {
    if (std::isinf(x)) return caf::sec::invalid_argument;
    return {};
  }
};

/// CAF's binary_deserializer, except that a sequence may not claim more elements than
/// there are bytes left. CAF 0.17.6 resizes a vector to the length it reads before reading
/// the elements, so a 10-byte message can ask for gigabytes: the known reason nodes
/// refuse non-loopback peers without TLS (net/cluster.cpp, check_publish). Inside CAF; the
/// fuzz target bounds it to reach the code behind it.
class bounded_deserializer final : public caf::deserializer {
 public:
  bounded_deserializer(caf::actor_system& sys, const char* buf, size_t n)
      : caf::deserializer(sys), inner_(sys, buf, n) {}
  caf::error begin_object(uint16_t& nr, std::string& name) override {
    return inner_.begin_object(nr, name);
  }
  caf::error end_object() override { return inner_.end_object(); }
  caf::error begin_sequence(size_t& n) override {
    if (auto e = inner_.begin_sequence(n)) return e;
    if (n > inner_.remaining()) return caf::sec::end_of_stream;
    return {};
  }
  caf::error end_sequence() override { return inner_.end_sequence(); }
  caf::error apply_raw(size_t n, void* data) override { return inner_.apply_raw(n, data); }

 protected:
  caf::error apply_impl(int8_t& x) override { return inner_(x); }
  caf::error apply_impl(uint8_t& x) override { return inner_(x); }
  caf::error apply_impl(int16_t& x) override { return inner_(x); }
  caf::error apply_impl(uint16_t& x) override { return inner_(x); }
  caf::error apply_impl(int32_t& x) override { return inner_(x); }
  caf::error apply_impl(uint32_t& x) override { return inner_(x); }
  caf::error apply_impl(int64_t& x) override { return inner_(x); }
  caf::error apply_impl(uint64_t& x) override { return inner_(x); }
  caf::error apply_impl(float& x) override { return inner_(x); }
  caf::error apply_impl(double& x) override { return inner_(x); }
  caf::error apply_impl(long double& x) override { return inner_(x); }
  caf::error apply_impl(std::string& x) override { return inner_(x); }
  caf::error apply_impl(std::u16string& x) override { return inner_(x); }
  caf::error apply_impl(std::u32string& x) override { return inner_(x); }

 private:
  caf::binary_deserializer inner_;
};

template <class T>
void round_trip(const uint8_t* data, size_t size) {
  T x;
  bounded_deserializer src{fuzz_system(), reinterpret_cast<const char*>(data), size};
  if (src(x)) return;
  finite_check finite{fuzz_system()};
  if (finite(x)) return;
  std::vector<char> first;
  caf::binary_serializer out1{fuzz_system(), first};
  if (out1(x)) return;
  T y;
  caf::binary_deserializer again{fuzz_system(), first};
  if (again(y)) std::abort();  // our own bytes must read back
  std::vector<char> second;
  caf::binary_serializer out2{fuzz_system(), second};
  if (out2(y) || first != second) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  auto* body = data + 1;
  auto n = size - 1;
  switch (data[0] % 16) {
    case 0: {
      bounded_deserializer src{fuzz_system(), reinterpret_cast<const char*>(body), n};
      caf::message msg;
      (void)src(msg);
      break;
    }
    case 1:
      return round_trip<model_config>(body, n), 0;
    case 2:
      return round_trip<shard_spec>(body, n), 0;
    case 3:
      return round_trip<shard_report>(body, n), 0;
    case 4:
      return round_trip<transfer_report>(body, n), 0;
    case 5:
      return round_trip<row_sampling>(body, n), 0;
    case 6:
      return round_trip<tensor_payload>(body, n), 0;
    case 7:
      return round_trip<step_request>(body, n), 0;
    case 8:
      return round_trip<step_result>(body, n), 0;
    case 9:
      return round_trip<std::vector<device_report>>(body, n), 0;
    case 10:
      return round_trip<model_placement>(body, n), 0;
    case 11:
      return round_trip<lease>(body, n), 0;
    case 12:
      return round_trip<std::vector<residency_report>>(body, n), 0;
    case 13:
      return round_trip<std::vector<device_usage>>(body, n), 0;
    case 14:
      return round_trip<infer_request>(body, n), 0;
    default:
      return round_trip<std::vector<model_info>>(body, n), 0;
  }
  return 0;
}
