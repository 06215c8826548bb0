#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

/// A child process (the experiments' server, end-to-end tests): a real binary, its stdout read line
/// by line with deadlines, stopped with SIGTERM (SIGKILL if it does not exit in time).
namespace computron {

class child_process {
 public:
  explicit child_process(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_ = fds[0];
  }

  ~child_process() {
    stop(std::chrono::seconds(20));
    if (out_ >= 0) close(out_);
  }

  pid_t pid() const { return pid_; }

  /// The next stdout line, or nothing when none came before the deadline.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
        auto line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char buf[4096];
      auto n = ::read(out_, buf, sizeof(buf));
      if (n <= 0) return std::nullopt;
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }

  /// Whether the child has exited (reaping it); its exit code then, or -signal when a
  /// signal killed it.
  bool exited() {
    if (pid_ <= 0) return true;
    if (exited_) return true;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) != pid_) return false;
    exited_ = true;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : WIFSIGNALED(st) ? -WTERMSIG(st) : -1;
    return true;
  }
  int exit_status() const { return status_; }
  /// Sends `sig` (SIGKILL, SIGSTOP, SIGCONT: the failure tests) while it runs; to its
  /// whole process group when it leads one, as `timeout` does, so that the wrapped
  /// program gets it too.
  void signal(int sig) {
    if (pid_ <= 0 || exited_) return;
    kill(getpgid(pid_) == pid_ ? -pid_ : pid_, sig);
  }

  /// SIGTERM, then waits; SIGKILL after `grace`. Returns the exit status (or -1).
  int stop(std::chrono::milliseconds grace) {
    if (pid_ <= 0 || exited_) return status_;
    kill(pid_, SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + grace;
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        return status_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a child
    }
    // The group too: a program under `timeout` would otherwise outlive it, orphaned,
    // and keep the test's pipe (and ctest) waiting.
    kill(getpgid(pid_) == pid_ ? -pid_ : pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    exited_ = true;
    return -1;
  }

  /// Resident memory of the child and its descendants in KiB (0 when unknown). The tree,
  /// because tests start servers under /usr/bin/timeout, whose own RSS is 2 MiB.
  long rss_kib() const { return tree_rss_kib(pid_); }

 private:
  static long tree_rss_kib(pid_t pid) {
    long total = 0;
    {
      std::ifstream in{"/proc/" + std::to_string(pid) + "/status"};
      std::string key;
      while (in >> key) {
        if (key == "VmRSS:") {
          in >> total;
          break;
        }
        std::string rest;
        std::getline(in, rest);
      }
    }
    // Children of the main thread (the only thread that forks here).
    std::ifstream kids{"/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                       "/children"};
    pid_t kid = 0;
    while (kids >> kid) total += tree_rss_kib(kid);
    return total;
  }

 public:
 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
  bool exited_ = false;
  int status_ = -1;
};

}  // namespace computron
