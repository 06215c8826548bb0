// Runs a fuzz target over files and folders of inputs, without libFuzzer: the corpora in
// tests/fuzz/corpus replay in every build (the sanitizer pass included), so an input that
// once crashed stays a regression test.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  size_t inputs = 0;
  auto run = [&](const fs::path& p) {
    std::ifstream in{p, std::ios::binary};
    std::vector<uint8_t> bytes{std::istreambuf_iterator<char>{in}, {}};
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    ++inputs;
  };
  for (int i = 1; i < argc; ++i) {
    fs::path p{argv[i]};
    if (fs::is_directory(p)) {
      for (auto& e : fs::recursive_directory_iterator{p})
        if (e.is_regular_file()) run(e.path());
    } else if (fs::is_regular_file(p)) {
      run(p);
    } else {
      std::fprintf(stderr, "replay: no input at %s\n", argv[i]);
      return 2;
    }
  }
  if (inputs == 0) {
    std::fprintf(stderr, "replay: no inputs\n");
    return 2;
  }
  std::printf("replay: %zu inputs, no crash\n", inputs);
  return 0;
}
