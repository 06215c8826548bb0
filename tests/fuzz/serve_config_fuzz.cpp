// Fuzz target: a serve config file (serve/serve_config.cpp), read from a file
// in a folder of its own so relative paths in it resolve there.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/log.hpp"
#include "serve/serve_config.hpp"
#include "tests/fuzz/memfile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    computron::log::set_level(computron::log::level::off);
    static computron::fuzz::scratch_dir scratch{"config"};
    if (scratch.path().empty()) std::abort();
    return scratch.path() + "/serve.json";
  }();
  {
    std::ofstream out{path, std::ios::binary | std::ios::trunc};
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  (void)computron::serve::load_serve_config(path);
  return 0;
}
