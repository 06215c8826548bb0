// A race of our own on memory CAF allocated, made through the same out-of-line libstdc++
// string calls (_M_replace's memcpy against compare's memcmp) as the CAF report that
// cmake/tsan_report_filter.cpp drops. The filter drops a race only when no frame of ours
// is on either access stack and CAF allocated the block; here CAF allocated it too, so
// only our frames keep the report. scripts/tsan runs this and expects ThreadSanitizer to
// report it and fail (exit 66): the filter and cmake/tsan.supp keep our races.
#include <cstdio>
#include <string>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/type_erased_value.hpp>
#include <caf/type_nr.hpp>
#include <caf/uniform_type_info_map.hpp>

namespace {

__attribute__((noinline)) void probe_writer(std::string& text) {
  for (int i = 0; i < 1000; ++i) text.replace(0, 8, 8, static_cast<char>('a' + i % 26));
}

__attribute__((noinline)) int probe_reader(const std::string& text) {
  int equal = 0;
  for (int i = 0; i < 1000; ++i) equal += text.compare("never equal") == 0;
  return equal;
}

}  // namespace

int main() {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  // A string value made inside libcaf_core, as its deserializer makes one.
  auto value = sys.types().make_value(caf::type_nr<std::string>::value);
  if (!value) return 2;
  auto& text = value->get_mutable_as<std::string>();
  // Short, as in the CAF report: the characters stay in the string's own buffer, inside
  // the block CAF allocated.
  text.assign(12, 'a');
  int equal = 0;
  std::thread writer{[&] { probe_writer(text); }};
  std::thread reader{[&] { equal = probe_reader(text); }};
  writer.join();
  reader.join();
  std::printf("tsan_race_probe: finished without a report (%d)\n", equal);
  return 0;
}
