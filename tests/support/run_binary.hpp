#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

/// The `computron` binary run as a user runs it, for the CLI tests.
namespace computron::test {

struct process_result {
  int exit_code = -1;
  std::string out;  // stdout
  std::string all;  // stdout and, when asked for, stderr
};

/// Runs a shell command line (bounded by the caller, e.g. with `timeout`) and reads its
/// stdout.
inline process_result run_command(const std::string& cmd) {
  process_result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.all = r.out;
  return r;
}

/// Runs COMPUTRON_BINARY with `args` under `timeout` so no test can hang; stderr joins
/// stdout when `with_stderr`, else it is dropped.
inline process_result run(const std::string& args, bool with_stderr = false) {
  return run_command(std::string{"COMPUTRON_LOG_LEVEL=warn timeout 120 "} + COMPUTRON_BINARY + " " +
                     args + (with_stderr ? " 2>&1" : " 2>/dev/null"));
}

/// Reads the port from a serve process's "listening on http://127.0.0.1:PORT" line.
template <class Child>
uint16_t wait_for_port(Child& proc) {
  auto line = proc.read_line(std::chrono::seconds(120));
  REQUIRE(line);
  auto at = line->find("127.0.0.1:");
  REQUIRE(at != std::string::npos);
  return static_cast<uint16_t>(std::stoi(line->substr(at + 10)));
}

}  // namespace computron::test
