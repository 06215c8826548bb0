// A race of our own, made through the same out-of-line libstdc++ string calls
// (_M_replace's memcpy against compare's memcmp) as the CAF report that
// cmake/tsan_report_filter.cpp drops. scripts/tsan runs it and expects ThreadSanitizer to
// report it and fail (exit 66): the filter and cmake/tsan.supp keep our races.
#include <cstdio>
#include <string>
#include <thread>

namespace {

// Longer than the short-string buffer: the characters live in a heap block our code
// allocated.
std::string shared_text(64, 'a');

__attribute__((noinline)) void probe_writer() {
  for (int i = 0; i < 1000; ++i) shared_text.replace(0, 32, 32, static_cast<char>('a' + i % 26));
}

__attribute__((noinline)) int probe_reader() {
  int equal = 0;
  for (int i = 0; i < 1000; ++i) equal += shared_text.compare("never equal") == 0;
  return equal;
}

}  // namespace

int main() {
  int equal = 0;
  std::thread writer{probe_writer};
  std::thread reader{[&] { equal = probe_reader(); }};
  writer.join();
  reader.join();
  std::printf("tsan_race_probe: finished without a report (%d)\n", equal);
  return 0;
}
