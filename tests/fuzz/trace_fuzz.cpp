// Fuzz target: a trace file for loadgen and the simulator (workload/arrivals.cpp).
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "workload/arrivals.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in{std::string{reinterpret_cast<const char*>(data), size}};
  auto s = computron::workload::parse_trace(in, "fuzz");
  if (!s) return 0;
  // What parses must write back and parse to the same number of requests.
  std::ostringstream out;
  computron::workload::write_trace(out, *s);
  std::istringstream again{out.str()};
  auto t = computron::workload::parse_trace(again, "again");
  if (!t || t->arrivals.size() != s->arrivals.size()) __builtin_trap();
  return 0;
}
